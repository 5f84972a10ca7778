package gpuscore

// Every case of testdata/vectors.json, generated from the extender's scoring.py by
// `python -m gpufleet_lab.conformance` (the lab's tests regenerate it and compare byte for byte).

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"reflect"
	"slices"
	"sort"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

type vectorNode struct {
	Name       string                          `json:"name"`
	SampleTime float64                         `json:"sampleTime"`
	Devices    map[string][][4]json.RawMessage `json:"devices"` // [key, util, mem, pods]
	// Resources is the order of Devices in the extender (Python's dict order, which the sorted JSON keys lose):
	// sums over all of a node's devices follow it.
	Resources []string `json:"resources"`
}

type vectorFile struct {
	Version int `json:"version"`
	Args    []struct {
		Args   json.RawMessage `json:"args"`
		Valid  bool            `json:"valid"`
		Errors []string        `json:"errors"`
	} `json:"args"`
	Decisions []struct {
		Args       json.RawMessage           `json:"args"`
		Now        float64                   `json:"now"`
		Nodes      []vectorNode              `json:"nodes"`
		Candidates []string                  `json:"candidates"`
		Request    [][2]json.RawMessage      `json:"request"`
		Assumed    map[string]map[string]int `json:"assumed"`
		Modes      map[string]Mode           `json:"modes"`
		Tenants    *struct {
			Namespace       string            `json:"namespace"`
			NamespaceTenant *string           `json:"namespaceTenant"`
			NodeTenants     map[string]string `json:"nodeTenants"`
		} `json:"tenants"`
		Expect map[string][4]json.RawMessage `json:"expect"`
	} `json:"decisions"`
	Auto []struct {
		Args  json.RawMessage `json:"args"`
		Steps []struct {
			Now       float64            `json:"now"`
			Nodes     []vectorNode       `json:"nodes"`
			FleetLoad map[string]float64 `json:"fleetLoad"`
			Modes     map[string]Mode    `json:"modes"`
			Changed   map[string]Mode    `json:"changed"`
		} `json:"steps"`
	} `json:"auto"`
	Prometheus []promCase `json:"prometheus"`
	Requests   []struct {
		Spec   v1.PodSpec           `json:"spec"`
		Expect [][2]json.RawMessage `json:"expect"`
	} `json:"requests"`
	Claims []struct {
		Args       json.RawMessage               `json:"args"`
		Now        float64                       `json:"now"`
		Nodes      []vectorNode                  `json:"nodes"`
		Candidates []string                      `json:"candidates"`
		Modes      map[string]Mode               `json:"modes"`
		Placements map[string]int64              `json:"placements"`
		Expect     map[string][5]json.RawMessage `json:"expect"` // verdict, then the claim's score
	} `json:"claims"`
}

// promCase is a Prometheus answer (series and sample times) and the extender's snapshot of it.
type promCase struct {
	NodeNameLabels []string `json:"nodeNameLabels"`
	QueriedAt      float64  `json:"queriedAt"`
	Now            float64  `json:"now"`
	MaxSkew        float64  `json:"maxClockSkewSeconds"`
	Series         []Series `json:"series"`
	Times          []Series `json:"times"`
	Expect         struct {
		Nodes        []vectorNode `json:"nodes"`
		NewestSample *float64     `json:"newestSample"`
	} `json:"expect"`
}

func loadVectors(t *testing.T) *vectorFile {
	t.Helper()
	raw, err := os.ReadFile("testdata/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vectors vectorFile
	if err := json.Unmarshal(raw, &vectors); err != nil {
		t.Fatalf("testdata/vectors.json: %v", err)
	}
	if vectors.Version != 1 {
		t.Fatalf("vectors format %d, this test reads 1", vectors.Version)
	}
	return &vectors
}

func mustUnmarshal(t *testing.T, raw json.RawMessage, into any) {
	t.Helper()
	if err := json.Unmarshal(raw, into); err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
}

func decodeArgs(raw json.RawMessage) (Args, error) {
	args, problems := readArgs(&runtime.Unknown{Raw: raw, ContentType: runtime.ContentTypeJSON})
	if len(problems) == 0 {
		problems = Problems(ValidateArgs(nil, &args))
	}
	return args, joined(problems)
}

func snapshotOf(t *testing.T, nodes []vectorNode) *Snapshot {
	t.Helper()
	s := &Snapshot{Nodes: map[string]*NodeMetrics{}}
	for _, n := range nodes {
		metrics := &NodeMetrics{Name: n.Name, SampleTime: n.SampleTime, Devices: map[string][]Device{}, Resources: n.Resources}
		for _, resource := range n.Resources {
			devices := n.Devices[resource]
			list := []Device{} // a resource with no device stays in the map, as in Python
			for _, d := range devices {
				var device Device
				mustUnmarshal(t, d[0], &device.Key)
				mustUnmarshal(t, d[1], &device.Util)
				if string(d[2]) != "null" {
					mustUnmarshal(t, d[2], &device.Mem)
					device.HasMem = true
				}
				if string(d[3]) != "null" {
					mustUnmarshal(t, d[3], &device.Pods)
					device.HasPods = true
				}
				list = append(list, device)
			}
			metrics.Devices[resource] = list
		}
		s.Nodes[n.Name] = metrics
		s.Order = append(s.Order, n.Name)
	}
	return s
}

func requestOf(t *testing.T, pairs [][2]json.RawMessage) []ResourceRequest {
	var request []ResourceRequest
	for _, pair := range pairs {
		var r ResourceRequest
		mustUnmarshal(t, pair[0], &r.Resource)
		mustUnmarshal(t, pair[1], &r.Count)
		request = append(request, r)
	}
	return request
}

// Every problem, in the same words as the extender's check (the order aside: each side lists fields in its own).
func TestVectorsArgs(t *testing.T) {
	for i, c := range loadVectors(t).Args {
		_, problems := ParseArgs(&runtime.Unknown{Raw: c.Args, ContentType: runtime.ContentTypeJSON})
		if (len(problems) == 0) != c.Valid {
			t.Errorf("args[%d] %s: extender valid=%v, plugin problems %q", i, c.Args, c.Valid, problems)
		}
		got, want := slices.Sorted(slices.Values(problems)), slices.Sorted(slices.Values(c.Errors))
		if !slices.Equal(got, want) {
			t.Errorf("args[%d] %s:\n plugin   %q\n extender %q", i, c.Args, got, want)
		}
	}
}

func TestVectorsDecisions(t *testing.T) {
	vectors := loadVectors(t)
	checked := 0
	for i, c := range vectors.Decisions {
		args, err := decodeArgs(c.Args)
		if err != nil {
			t.Fatalf("decisions[%d]: args %s refused: %v", i, c.Args, err)
		}
		policy := args.Policy()
		snapshot := snapshotOf(t, c.Nodes)
		ranked := snapshotOf(t, c.Nodes) // the refresher's form: devices ranked once per snapshot
		ranked.Rank(&policy)
		request := requestOf(t, c.Request)
		for _, name := range c.Candidates {
			var want Verdict
			mustUnmarshal(t, c.Expect[name][0], &want.Passed)
			mustUnmarshal(t, c.Expect[name][1], &want.Score)
			mustUnmarshal(t, c.Expect[name][2], &want.Outcome)
			mustUnmarshal(t, c.Expect[name][3], &want.Reason)
			// The plugin's verdict(): tenant rule, then Evaluate.
			var got Verdict
			reason := ""
			if c.Tenants != nil {
				namespaceTenant := ""
				if c.Tenants.NamespaceTenant != nil {
					namespaceTenant = *c.Tenants.NamespaceTenant
				}
				reason = TenantMismatch(name, c.Tenants.NodeTenants[name], c.Tenants.Namespace, namespaceTenant)
			}
			if reason != "" {
				got = Verdict{false, MinScore, OutcomeTenantMismatch, reason}
			} else {
				got = Evaluate(name, snapshot.Nodes[name], request, &policy, c.Now, c.Assumed[name], c.Modes, true)
				if fromRanked := Evaluate(name, ranked.Nodes[name], request, &policy, c.Now, c.Assumed[name], c.Modes, true); fromRanked != got {
					t.Errorf("decisions[%d] node %s: ranked snapshot gives %+v, unranked %+v", i, name, fromRanked, got)
				}
				// The scheduling path's form: the same verdict without the reason text.
				fast := Evaluate(name, ranked.Nodes[name], request, &policy, c.Now, c.Assumed[name], c.Modes, false)
				if fast.Reason != "" || fast.Passed != got.Passed || fast.Score != got.Score || fast.Outcome != got.Outcome {
					t.Errorf("decisions[%d] node %s: without reasons %+v, with %+v", i, name, fast, got)
				}
				// Asked again: from the snapshot's memo this time.
				if again := Evaluate(name, ranked.Nodes[name], request, &policy, c.Now, c.Assumed[name], c.Modes, false); again != fast {
					t.Errorf("decisions[%d] node %s: memoized %+v, computed %+v", i, name, again, fast)
				}
			}
			if got != want {
				t.Errorf("decisions[%d] node %s:\n  extender %+v\n  plugin   %+v", i, name, want, got)
			}
			checked++
		}
	}
	t.Logf("%d decisions, %d node verdicts", len(vectors.Decisions), checked)
}

// A DRA claim's load verdict (scoring.claim_load_verdict) and GPUClaimScore's score (scoring.claim_score).
func TestVectorsClaims(t *testing.T) {
	vectors := loadVectors(t)
	if len(vectors.Claims) < 40 {
		t.Fatalf("vectors.json has %d claim cases; regenerate it", len(vectors.Claims))
	}
	checked := 0
	for i, c := range vectors.Claims {
		args, err := decodeArgs(c.Args)
		if err != nil {
			t.Fatalf("claims[%d]: args %s refused: %v", i, c.Args, err)
		}
		policy := args.Policy()
		snapshot := snapshotOf(t, c.Nodes)
		ranked := snapshotOf(t, c.Nodes)
		ranked.Rank(&policy)
		for _, name := range c.Candidates {
			var want Verdict
			var wantScore int64
			mustUnmarshal(t, c.Expect[name][0], &want.Passed)
			mustUnmarshal(t, c.Expect[name][1], &want.Score)
			mustUnmarshal(t, c.Expect[name][2], &want.Outcome)
			mustUnmarshal(t, c.Expect[name][3], &want.Reason)
			mustUnmarshal(t, c.Expect[name][4], &wantScore)
			got := ClaimLoadVerdict(name, snapshot.Nodes[name], &policy, c.Now, c.Modes, true)
			if got != want {
				t.Errorf("claims[%d] node %s:\n  extender %+v\n  plugin   %+v", i, name, want, got)
			}
			fast := ClaimLoadVerdict(name, ranked.Nodes[name], &policy, c.Now, c.Modes, false)
			if fast.Passed != got.Passed || fast.Score != got.Score || fast.Outcome != got.Outcome {
				t.Errorf("claims[%d] node %s: without reasons %+v, with %+v", i, name, fast, got)
			}
			if score := ClaimNodeScore(c.Placements[name], fast); score != wantScore {
				t.Errorf("claims[%d] node %s: placement %d, load %+v: score %d, scoring.claim_score says %d",
					i, name, c.Placements[name], fast, score, wantScore)
			}
			checked++
		}
	}
	t.Logf("%d claim cases, %d node scores", len(vectors.Claims), checked)
}

func TestVectorsAuto(t *testing.T) {
	for i, c := range loadVectors(t).Auto {
		args, err := decodeArgs(c.Args)
		if err != nil {
			t.Fatalf("auto[%d]: %v", i, err)
		}
		policy := args.Policy()
		selector := &ModeSelector{PackBelow: policy.AutoPackBelow, Hysteresis: policy.AutoHysteresis}
		for j, step := range c.Steps {
			load := FleetMeanLoad(snapshotOf(t, step.Nodes), &policy, step.Now)
			if !reflect.DeepEqual(load, step.FleetLoad) {
				t.Errorf("auto[%d] step %d: fleet load extender %v, plugin %v", i, j, step.FleetLoad, load)
			}
			changed := selector.Update(load)
			if !reflect.DeepEqual(selector.Modes, step.Modes) || !reflect.DeepEqual(changed, step.Changed) {
				t.Errorf("auto[%d] step %d: modes extender %v (changed %v), plugin %v (changed %v)",
					i, j, step.Modes, step.Changed, selector.Modes, changed)
			}
		}
	}
}

func TestVectorsPrometheus(t *testing.T) {
	for i, c := range loadVectors(t).Prometheus {
		got := SnapshotFromSeries(c.Series, c.Times, c.NodeNameLabels, c.QueriedAt, c.Now, c.MaxSkew, 1)
		compareSnapshot(t, fmt.Sprintf("prometheus[%d]", i), got, c.Expect.Nodes, c.Expect.NewestSample)
	}
}

func TestVectorsRequests(t *testing.T) {
	for i, c := range loadVectors(t).Requests {
		got := PodGPURequest(&v1.Pod{Spec: c.Spec})
		want := requestOf(t, c.Expect)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("requests[%d]: extender %v, plugin %v", i, want, got)
		}
	}
}

// The float helpers the reasons depend on.
func TestPythonFormatting(t *testing.T) {
	cases := map[float64]string{30: "30", 2.5: "2.5", 0.1: "0.1", 123456789: "1.23457e+08", 1e-5: "1e-05", 0: "0"}
	keys := make([]float64, 0, len(cases))
	for k := range cases {
		keys = append(keys, k)
	}
	sort.Float64s(keys)
	for _, x := range keys {
		if got := pyG(x); got != cases[x] {
			t.Errorf("pyG(%v) = %q, Python says %q", x, got, cases[x])
		}
	}
	if pyRound(2.5) != 2 || pyRound(3.5) != 4 || pyRound(-0.5) != 0 || pyRound(math.Nextafter(2.5, 3)) != 3 {
		t.Error("pyRound must round halves to even like Python's round()")
	}
}

// compareSnapshot checks the plugin's snapshot against the extender's (a vectors case's expectation): the nodes in
// order, each node's devices, and the newest sample (nil: none).
func compareSnapshot(t *testing.T, where string, got *Snapshot, nodes []vectorNode, newest *float64) {
	t.Helper()
	want := snapshotOf(t, nodes)
	if fmt.Sprint(got.Order) != fmt.Sprint(want.Order) {
		t.Errorf("%s: node order extender %v, plugin %v", where, want.Order, got.Order)
		return
	}
	for _, name := range want.Order {
		if !reflect.DeepEqual(got.Nodes[name], want.Nodes[name]) {
			t.Errorf("%s node %s:\n  extender %+v\n  plugin   %+v", where, name, want.Nodes[name], got.Nodes[name])
		}
	}
	wantNewest := 0.0
	if newest != nil {
		wantNewest = *newest
	}
	if got.NewestSample != wantNewest {
		t.Errorf("%s: newest sample extender %v, plugin %v", where, wantNewest, got.NewestSample)
	}
}
