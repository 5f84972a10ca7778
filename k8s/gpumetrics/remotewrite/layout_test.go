package remotewrite

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"testing"

	"github.com/gpufleet/mig/k8s/gpuscore"
)

// A reader that keeps nodes' layouts between snapshots publishes what the whole fold would make of the Store's
// series at every step: random writes add series (whole GPUs, MIG instances, GPUs known by UUID only, several
// series of one metric for the pods sharing a device), update values (some NaN, infinite or out of range, which
// the whole fold screens), end series with stale markers and come out of order.
func TestALaidOutNodeFoldsAsTheWholeFold(t *testing.T) {
	metrics := gpuscore.DCGMMetrics()
	for seed := range uint64(20) {
		h := newHarness(t)
		random := rand.New(rand.NewPCG(seed, 40))
		ms := t0
		var known [][]Label // series written so far, to update or end
		for step := range 150 {
			var write []TimeSeries
			for range 1 + random.IntN(12) {
				var labels []Label
				if len(known) > 0 && random.IntN(3) > 0 {
					labels = known[random.IntN(len(known))]
				} else {
					labels = randomSeries(random, metrics)
					known = append(known, labels)
				}
				value := randomValue(random, labels[0].Value)
				stamp := ms
				if random.IntN(10) == 0 {
					stamp -= int64(1 + random.IntN(5000)) // out of order for a series written since
				}
				write = append(write, TimeSeries{labels, []Sample{{value, stamp}}})
			}
			ms += int64(random.IntN(1500))
			if status := h.post(body(write), nil); status != 204 {
				t.Fatalf("seed %d step %d: status %d", seed, step, status)
			}
			got, err := h.source.Fetch(context.Background(), uint64(step+1))
			if err != nil {
				t.Fatal(err)
			}
			if held := heldSeries(h.store); held != h.store.held {
				t.Fatalf("seed %d step %d: the Store counts %d series, holds %d", seed, step, h.store.held, held)
			}
			if got == nil {
				continue
			}
			if want := wholeFold(h, uint64(step+1)); !reflect.DeepEqual(got, want) {
				t.Fatalf("seed %d step %d: laid out %s\nwhole fold %s", seed, step, describe(got), describe(want))
			}
		}
	}
}

// wholeFold is the snapshot of the Store's series folded whole (gpuscore.NodeFromSamples), as before layouts.
func wholeFold(h *harness, version uint64) *gpuscore.Snapshot {
	h.store.mu.Lock()
	defer h.store.mu.Unlock()
	var nodes []*gpuscore.NodeMetrics
	for _, node := range h.store.order {
		var samples []gpuscore.Sample
		for _, held := range node.list {
			if !held.removed {
				samples = append(samples, held.sample)
			}
		}
		if metrics := gpuscore.NodeFromSamples(samples, node.name, float64(node.newest)/1000, nodeLabels); len(samples) > 0 && metrics != nil {
			nodes = append(nodes, metrics)
		}
	}
	return gpuscore.SnapshotOfNodes(nodes, h.now, 5, version)
}

func heldSeries(st *Store) int {
	st.mu.Lock()
	defer st.mu.Unlock()
	held := 0
	for _, node := range st.nodes {
		held += node.held
	}
	return held
}

func describe(s *gpuscore.Snapshot) string {
	out := fmt.Sprintf("%v newest %v", s.Order, s.NewestSample)
	for _, name := range s.Order {
		node := s.Nodes[name]
		out += fmt.Sprintf("\n  %s at %v %v %+v", name, node.SampleTime, node.Resources, node.Devices)
	}
	return out
}

// randomSeries is one dcgm series of a random device of three nodes, with the labels Prometheus' scrape gives it.
func randomSeries(random *rand.Rand, metrics []string) []Label {
	node := fmt.Sprintf("node-%d", random.IntN(3))
	gpu := fmt.Sprint(random.IntN(3))
	labels := []Label{{"__name__", metrics[random.IntN(len(metrics))]}, {"job", "dcgm-exporter"}, {"namespace", "gpufleet-node-agents"}}
	if random.IntN(2) == 0 {
		labels = append(labels, Label{"Hostname", node})
	} else {
		labels = append(labels, Label{"hostname", node})
	}
	if random.IntN(8) > 0 {
		labels = append(labels, Label{"gpu", gpu})
	}
	labels = append(labels, Label{"UUID", "GPU-" + node + "-" + gpu})
	if random.IntN(2) == 0 {
		labels = append(labels, Label{"GPU_I_ID", fmt.Sprint(1 + random.IntN(3))})
		if random.IntN(6) > 0 {
			labels = append(labels, Label{"GPU_I_PROFILE", []string{"1g.10gb", "2g.20gb", "3g.40gb"}[random.IntN(3)]})
		}
	}
	switch random.IntN(4) {
	case 0: // the exporter's own pod: Prometheus renamed the device's pod to exported_pod
		labels = append(labels, Label{"pod", "dcgm-exporter-x"}, Label{"exported_pod", fmt.Sprintf("job-%d", random.IntN(3))},
			Label{"exported_namespace", "tenant-a"})
	case 1:
		labels = append(labels, Label{"pod", fmt.Sprintf("job-%d", random.IntN(3))}, Label{"namespace", "tenant-b"})
	case 2:
		labels = append(labels, Label{"pod", ""})
	}
	return labels
}

func randomValue(random *rand.Rand, metric string) float64 {
	switch random.IntN(40) {
	case 0:
		return math.Float64frombits(staleNaN)
	case 1:
		return math.NaN()
	case 2:
		return math.Inf(1)
	case 3:
		return -1
	case 4:
		return 250 // out of range for utilisation, in range for memory
	}
	switch metric {
	case "DCGM_FI_DEV_GPU_UTIL":
		return float64(random.IntN(101))
	case "DCGM_FI_PROF_GR_ENGINE_ACTIVE":
		return random.Float64()
	}
	return float64(random.IntN(3)) * 1000 * random.Float64()
}

// A sender that lets through more series than a fleet has cannot grow the Store without bound: beyond its most,
// new series are not kept and are counted, the series held keep taking samples, and a series that ends (a stale
// marker) makes room for a new one.
func TestTheStoreHoldsAtMostMaxSeries(t *testing.T) {
	h := newHarness(t)
	h.store.maxSeries = 6 // two devices' three series
	over := counter(t, seriesOverLimit)
	first := [][]TimeSeries{deviceSeries("node-a", 0, 1, 0.25, 100, 300, t0), deviceSeries("node-a", 0, 2, 0.5, 100, 100, t0)}
	if status := h.post(body(first...), nil); status != 204 {
		t.Fatalf("status %d", status)
	}
	third := deviceSeries("node-b", 1, 1, 0.9, 100, 100, t0+1000)
	if status := h.post(body(third, deviceSeries("node-a", 0, 1, 0.75, 100, 300, t0+1000)), nil); status != 204 {
		t.Fatalf("status %d", status)
	}
	if got := counter(t, seriesOverLimit) - over; got != 3 {
		t.Errorf("%g samples over the limit, want node-b's 3", got)
	}
	s := h.snapshot()
	if _, ok := s.Nodes["node-b"]; ok || s.Nodes["node-a"].Devices["nvidia.com/mig-2g.20gb"][0].Util != 0.75 {
		t.Fatalf("over the limit: %s", describe(s))
	}
	stale := deviceSeries("node-a", 0, 2, 0, 0, 0, t0+2000)
	for i := range stale {
		stale[i].Samples[0].Value = math.Float64frombits(staleNaN)
	}
	if status := h.post(body(stale, deviceSeries("node-b", 1, 1, 0.9, 100, 100, t0+3000)), nil); status != 204 {
		t.Fatalf("status %d", status)
	}
	s = h.snapshot()
	if node := s.Nodes["node-b"]; node == nil || node.Devices["nvidia.com/mig-2g.20gb"][0].Util != 0.9 || h.store.held != 6 {
		t.Fatalf("after a device ended, %d series held: %s", h.store.held, describe(s))
	}
}

// MaxSeries is the settings contract's bound on a receiver, as the extender reads it.
func TestMaxSeriesIsTheContracts(t *testing.T) {
	raw, err := os.ReadFile("../../../extender/src/gpufleet_extender/settings_contract.json")
	if err != nil {
		t.Fatal(err)
	}
	var contract struct {
		Receivers struct {
			MaxSeries int `json:"maxSeries"`
		} `json:"receivers"`
	}
	if err := json.Unmarshal(raw, &contract); err != nil {
		t.Fatal(err)
	}
	if contract.Receivers.MaxSeries != MaxSeries {
		t.Errorf("the settings contract's receivers.maxSeries is %d, GPUScore's MaxSeries %d", contract.Receivers.MaxSeries, MaxSeries)
	}
}
