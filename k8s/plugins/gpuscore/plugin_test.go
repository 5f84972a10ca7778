package gpuscore

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpufleet/mig/k8s/gpumetrics"
	"github.com/gpufleet/mig/k8s/gpuscore"

	"github.com/gpufleet/mig/k8s/gpumetrics/metricstest"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
)

const mig = metricstest.MIG

func migPod(name string, count int64) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name)},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{
			Limits: v1.ResourceList{mig: *resource.NewQuantity(count, resource.DecimalSI)},
		}}}},
	}
}

func nodeInfo(name string, labels map[string]string) fwk.NodeInfo {
	info := framework.NewNodeInfo()
	info.SetNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}})
	return info
}

func testPlugin(t *testing.T, args gpuscore.Args, source gpumetrics.Source, now float64) *GPUScore {
	t.Helper()
	if errs := gpuscore.ValidateArgs(nil, &args); len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	g := newPlugin(args, source)
	g.clock = func() float64 { return now }
	g.metrics.RefreshOnce(context.Background())
	return g
}

// schedule runs one cycle the way the framework does and returns the best node (ties: first name).
func schedule(t *testing.T, g *GPUScore, pod *v1.Pod, nodes []string) (string, map[string]*fwk.Status) {
	t.Helper()
	ctx := context.Background()
	state := framework.NewCycleState()
	if _, status := g.PreFilter(ctx, state, pod, nil); !status.IsSuccess() {
		t.Fatalf("PreFilter: %v", status)
	}
	rejected := map[string]*fwk.Status{}
	best, bestScore := "", int64(-1)
	for _, name := range nodes {
		info := nodeInfo(name, nil)
		if status := g.Filter(ctx, state, pod, info); !status.IsSuccess() {
			rejected[name] = status
			continue
		}
		score, status := g.Score(ctx, state, pod, info)
		if !status.IsSuccess() {
			t.Fatalf("Score: %v", status)
		}
		if score > bestScore {
			best, bestScore = name, score
		}
	}
	if best != "" {
		if status := g.Reserve(ctx, state, pod, best); !status.IsSuccess() {
			t.Fatalf("Reserve: %v", status)
		}
	}
	return best, rejected
}

func TestFilterRefusesNodesAtTheThresholdAndScoreScalesTheExtenderScore(t *testing.T) {
	now := 1000.0
	source := &metricstest.Source{Snapshot: metricstest.Fleet(now, map[string][]float64{"hot": {0.8, 0.95}, "warm": {0.6, 0.4}, "cool": {0.1, 0.3}})}
	g := testPlugin(t, gpuscore.DefaultArgs(), source, now)
	ctx := context.Background()
	state := framework.NewCycleState()
	pod := migPod("p", 1)
	if _, status := g.PreFilter(ctx, state, pod, nil); !status.IsSuccess() {
		t.Fatal(status)
	}
	status := g.Filter(ctx, state, pod, nodeInfo("hot", nil))
	if status.Code() != fwk.Unschedulable || !strings.Contains(status.Message(), "hot: no nvidia.com/mig-2g.20gb instance below thresholds") {
		t.Fatalf("hot node: %v", status)
	}
	for node, want := range map[string]int64{"warm": 70, "cool": 90} { // 10 x (1 - 0.7 x best util), x 10
		if !g.Filter(ctx, state, pod, nodeInfo(node, nil)).IsSuccess() {
			t.Fatalf("%s refused", node)
		}
		score, _ := g.Score(ctx, state, pod, nodeInfo(node, nil))
		verdict := gpuscore.Evaluate(node, source.Snapshot.Nodes[node], gpuscore.PodGPURequest(pod), &g.policy, now, nil, nil, true)
		if score != int64(verdict.Score)*10 || score != want {
			t.Errorf("%s: score %d, extender %d x 10, want %d", node, score, verdict.Score, want)
		}
	}
}

func TestPodsWithoutGPUsSkipTheFilterAndAreBatchable(t *testing.T) {
	g := testPlugin(t, gpuscore.DefaultArgs(), &metricstest.Source{Snapshot: metricstest.Fleet(1, nil)}, 1)
	plain := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c"}}}}
	if _, status := g.PreFilter(context.Background(), framework.NewCycleState(), plain, nil); status.Code() != fwk.Skip {
		t.Errorf("PreFilter of a pod without GPUs: %v, want Skip", status)
	}
	if _, status := g.SignPod(context.Background(), plain); !status.IsSuccess() {
		t.Errorf("SignPod of a pod without GPUs: %v", status)
	}
	if _, status := g.SignPod(context.Background(), migPod("p", 1)); status.IsSuccess() {
		t.Error("GPU pods must not be batched: their scores change with each placement")
	}
}

func TestABurstSpreadsThroughReserveAndUnreserveGivesTheDevicesBack(t *testing.T) {
	now := 1000.0
	nodes := []string{"a", "b", "c"}
	source := &metricstest.Source{Snapshot: metricstest.Fleet(now, map[string][]float64{"a": {0, 0}, "b": {0.1, 0.1}, "c": {0.2, 0.2}})}
	g := testPlugin(t, gpuscore.DefaultArgs(), source, now)
	placed := map[string]int{}
	for i := 0; i < 6; i++ {
		node, _ := schedule(t, g, migPod(fmt.Sprintf("p%d", i), 1), nodes)
		placed[node]++
	}
	if placed["a"] != 2 || placed["b"] != 2 || placed["c"] != 2 {
		t.Fatalf("six pods on three nodes of two idle instances: %v, want two each", placed)
	}
	// All instances are assumed busy now: a seventh pod fits nowhere.
	if node, rejected := schedule(t, g, migPod("p6", 1), nodes); node != "" || !strings.Contains(rejected["a"].Message(), "all 2 assumed busy") {
		t.Fatalf("seventh pod went to %q (%v)", node, rejected)
	}
	g.Unreserve(context.Background(), nil, migPod("p0", 1), "a")
	if node, _ := schedule(t, g, migPod("p7", 1), nodes); node != "a" {
		t.Fatalf("after Unreserve of a's pod the next one went to %q, want a", node)
	}
}

func TestInflightFollowsThePodInformer(t *testing.T) {
	now := 1000.0
	source := &metricstest.Source{Snapshot: metricstest.Fleet(now, map[string][]float64{"a": {0.1}})}
	g := testPlugin(t, gpuscore.DefaultArgs(), source, now)
	pod := migPod("p", 1)
	g.inflight.Reserve(pod.UID, "a", gpuscore.PodGPURequest(pod), now)
	pending := pod.DeepCopy() // an update before the binding shows must not drop the reservation
	g.inflight.Observe(pending, false, now)
	if got := g.inflight.Assumed(source.Snapshot, now)["a"][mig]; got != 1 {
		t.Fatalf("reserved pod: assumed %d, want 1", got)
	}
	bound := pod.DeepCopy()
	bound.Spec.NodeName = "a"
	bound.Status.ContainerStatuses = []v1.ContainerStatus{{State: v1.ContainerState{Running: &v1.ContainerStateRunning{
		StartedAt: metav1.NewTime(time.Unix(int64(now)-10, 0))}}}}
	g.inflight.Observe(bound, false, now)
	// The node's sample (taken at now) is newer than the container start: the sample shows the pod's load.
	if got := g.inflight.Assumed(source.Snapshot, now)["a"][mig]; got != 0 {
		t.Fatalf("running pod covered by a sample: assumed %d, want 0", got)
	}
	older := metricstest.Fleet(now-20, map[string][]float64{"a": {0.1}})
	if got := g.inflight.Assumed(older, now)["a"][mig]; got != 1 {
		t.Fatalf("running pod not covered by the sample: assumed %d, want 1", got)
	}
	if got := g.inflight.Assumed(older, now+gpuscore.DefaultArgs().InflightMaxSeconds+1)["a"][mig]; got != 0 {
		t.Fatalf("pod past inflightMaxSeconds: assumed %d, want 0", got)
	}
	g.inflight.Observe(bound, true, now)
	if got := g.inflight.Assumed(older, now)["a"][mig]; got != 0 {
		t.Fatalf("deleted pod: assumed %d, want 0", got)
	}
}

func TestTenantPoolsRefuseOtherTenantsUnresolvably(t *testing.T) {
	now := 1000.0
	g := testPlugin(t, gpuscore.DefaultArgs(), &metricstest.Source{Snapshot: metricstest.Fleet(now, map[string][]float64{"pool": {0.1}})}, now)
	state := framework.NewCycleState()
	state.Write(stateKey, &cycleState{request: []gpuscore.ResourceRequest{{Resource: mig, Count: 1}}, view: g.metrics.View(), now: now,
		tenantCheck: true, namespace: "default", namespaceTenant: "b"})
	status := g.Filter(context.Background(), state, migPod("p", 1), nodeInfo("pool", map[string]string{"gpufleet.io/tenant": "a"}))
	want := "pool: node is in tenant pool 'a'; namespace 'default' belongs to tenant b"
	if status.Code() != fwk.UnschedulableAndUnresolvable || status.Message() != want {
		t.Fatalf("got %v %q, want UnschedulableAndUnresolvable %q", status.Code(), status.Message(), want)
	}
}

func TestAMetricsOutageKeepsTheLastSnapshotUntilItGoesStale(t *testing.T) {
	now := 1000.0
	source := &metricstest.Source{Snapshot: metricstest.Fleet(now, map[string][]float64{"a": {0.9}})}
	args := gpuscore.DefaultArgs()
	args.OnMissingMetrics = "deny"
	g := testPlugin(t, args, source, now)
	source.Err = errors.New("connection refused")
	if g.metrics.RefreshOnce(context.Background()) {
		t.Fatal("a failed poll reported success")
	}
	if g.metrics.View().Snapshot.Nodes["a"] == nil {
		t.Fatal("a failed poll dropped the snapshot")
	}
	g.clock = func() float64 { return now + 31 }
	_, rejected := schedule(t, g, migPod("p", 1), []string{"a"})
	if msg := rejected["a"].Message(); msg != "a: GPU metrics are 31s old (max 30s) (ON_MISSING_METRICS=deny)" {
		t.Fatalf("stale node: %q", msg)
	}
}

func TestAutoModesMoveOncePerSnapshot(t *testing.T) {
	args := gpuscore.DefaultArgs()
	args.ScoringStrategy, args.PackTargetUtil = gpuscore.StrategyAuto, 0.5
	source := &metricstest.Source{Snapshot: metricstest.Fleet(gpumetrics.Now(), map[string][]float64{"a": {0.1, 0.1}})}
	g := testPlugin(t, args, source, gpumetrics.Now())
	if mode := g.metrics.View().Modes[mig]; mode != gpuscore.ModePack {
		t.Fatalf("quiet fleet: mode %q, want pack", mode)
	}
	source.Snapshot = metricstest.Fleet(gpumetrics.Now(), map[string][]float64{"a": {0.9, 0.9}})
	g.metrics.RefreshOnce(context.Background())
	if mode := g.metrics.View().Modes[mig]; mode != gpuscore.ModeSpread {
		t.Fatalf("busy fleet: mode %q, want spread", mode)
	}
}

func TestNewRefusesInvalidArgsWithEveryProblem(t *testing.T) {
	cases := map[string]string{
		`{"weightGPUUtil": 0.5}`:                                  "weightGPUUtil + weightMemUtil must be 1.0 (got 0.5 + 0.3 = 0.8)",
		`{"prometheusURL": "prometheus:9090", "threshold": 0.8}`:  `threshold: unknown argument; prometheusURL: must start with http:// or https:// (got "prometheus:9090")`,
		`{"gpuUtilThreshold": 1.5, "scoringStrategy": "binpack"}`: "gpuUtilThreshold: 1.5 is not in (0, 1]; scoringStrategy: must be spread, pack or auto",
		`{"scoringStrategy": "pack", "packTargetUtil": 0.8}`:      "packTargetUtil (0.8) must be below gpuUtilThreshold (0.8)",
		`{"weightGPUUtil": "0.7", "tenantPools": 1}`:              "tenantPools: must be true or false; weightGPUUtil: must be a number",
		// The names are judged once every entry's replicas are (as the extender does).
		`{"sharedResources": {"example.com/fpga": 2, "nvidia.com/mig-1g.10gb": 65}}`: "sharedResources: nvidia.com/mig-1g.10gb: 65 replicas is not in [1, 64]",
		`{"sharedResources": {"example.com/fpga": 2}}`:                               "sharedResources: names nvidia.com/gpu or nvidia.com/mig-<profile> resources, got example.com/fpga",
		// Each rule between fields is checked, not only the first that fails.
		`{"weightGPUUtil": 0.9, "scoringStrategy": "auto", "packTargetUtil": 0.85, "autoPackBelow": 0.7, "autoHysteresis": 0.5}`: "weightGPUUtil + weightMemUtil must be 1.0 (got 0.9 + 0.3 = 1.2); " +
			"packTargetUtil (0.85) must be below gpuUtilThreshold (0.8) with scoringStrategy=auto; autoPackBelow + autoHysteresis must be below 1 (got 0.7 + 0.5): auto would never spread",
		`{"interferenceWeight": 12}`: "interferenceWeight: 12 is not in [0, 10]",
	}
	for raw, want := range cases {
		_, err := New(context.Background(), &runtime.Unknown{Raw: []byte(raw), ContentType: runtime.ContentTypeJSON}, nil)
		if err == nil || !strings.HasPrefix(err.Error(), "invalid GPUScore args: ") || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want one containing %q", raw, err, want)
		}
	}
}

// A time-sliced resource fills up replica by replica: in-flight pods (Reserve) take the least-used devices first,
// as the device plugin does, and the node is refused once every replica is taken.
func TestSharedReplicasFillThroughReserve(t *testing.T) {
	now := 1000.0
	snapshot := metricstest.Fleet(now, map[string][]float64{"shared": {0.1, 0.5}})
	devices := snapshot.Nodes["shared"].Devices[mig]
	devices[0].Pods, devices[0].HasPods = 1, true // one pod already on the cool device, none on the warm one
	devices[1].HasPods = true
	args := gpuscore.DefaultArgs()
	args.SharedResources = map[string]int{mig: 2}
	g := testPlugin(t, args, &metricstest.Source{Snapshot: snapshot}, now)
	// 1st pod: only the warm device has the fewest pods (0): scored by it, 10 x (1 - 0.7 x 0.5) = 6.5 -> 6.
	// 2nd: both hold one pod, either may be handed out: mean 0.7 x 0.3 -> 8. 3rd: the last replica, on the warm one.
	for i, want := range []int{6, 8, 6} {
		state := framework.NewCycleState()
		pod := migPod(fmt.Sprintf("p%d", i), 1)
		ctx := context.Background()
		if _, status := g.PreFilter(ctx, state, pod, nil); !status.IsSuccess() {
			t.Fatal(status)
		}
		if status := g.Filter(ctx, state, pod, nodeInfo("shared", nil)); !status.IsSuccess() {
			t.Fatalf("pod %d refused: %v", i, status)
		}
		if score, _ := g.Score(ctx, state, pod, nodeInfo("shared", nil)); score != int64(want)*10 {
			t.Errorf("pod %d: score %d, want %d", i, score, want*10)
		}
		if status := g.Reserve(ctx, state, pod, "shared"); !status.IsSuccess() {
			t.Fatal(status)
		}
	}
	_, rejected := schedule(t, g, migPod("p3", 1), []string{"shared"})
	if status := rejected["shared"]; status == nil || !strings.Contains(status.Message(), "every "+mig+" replica taken (2 per device)") {
		t.Fatalf("4th pod: %v", status)
	}
}

func TestInflightIncrementalAnswersEqualARecount(t *testing.T) {
	now := 1000.0
	snapshot := metricstest.Fleet(now, map[string][]float64{"a": {0.1}, "b": {0.1}})
	f := NewInflight(120)
	recount := func(at float64) map[string]map[string]int {
		f.mu.Lock()
		f.version++ // forget the cached answer
		f.mu.Unlock()
		return f.Assumed(snapshot, at)
	}
	for i := 0; i < 12; i++ {
		at := now + float64(i)
		f.Assumed(snapshot, at) // each cycle reads, then reserves
		pod := migPod(fmt.Sprintf("p%d", i), int64(1+i%2))
		node := []string{"a", "b"}[i%2]
		f.Reserve(pod.UID, node, gpuscore.PodGPURequest(pod), at)
		if i%3 == 0 { // the binding shows up in the informer, dated at or before Reserve
			bound := pod.DeepCopy()
			bound.Spec.NodeName = node
			bound.Status.Conditions = []v1.PodCondition{{Type: v1.PodScheduled, Status: v1.ConditionTrue,
				LastTransitionTime: metav1.NewTime(time.Unix(int64(at)-1, 0))}}
			f.Observe(bound, false, at)
		}
		got := f.Assumed(snapshot, at)
		if want := recount(at); !reflect.DeepEqual(got, want) {
			t.Fatalf("after pod %d: incremental %v, recount %v", i, got, want)
		}
	}
	// Past the first pod's expiry the answer must change (the observed binding moved its expiry earlier).
	later := now + 120
	if got, want := f.Assumed(snapshot, later), recount(later); !reflect.DeepEqual(got, want) {
		t.Fatalf("at expiry: %v, recount %v", got, want)
	}
}
