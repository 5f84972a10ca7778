package gpuscore

import (
	"fmt"
	"math/rand"
	"testing"
)

// The scheduling path's memo answers what evaluateNode computes, for every input it is keyed by (count, in-flight
// devices, mode) and the ones it is not (in-flight pods of another resource with interference on), asked in random
// order so that a wrong key returns another input's answer.

const mig = "nvidia.com/mig-2g.20gb"

func TestMemoizedVerdictsEqualComputed(t *testing.T) {
	const shared, other = "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"
	rng := rand.New(rand.NewSource(7))
	for _, interference := range []float64{0, 0.5} {
		args := DefaultArgs()
		policy := args.Policy()
		policy.SharedResources = map[string]int{shared: 4}
		policy.InterferenceWeight = interference
		policy.Strategy = StrategyAuto // the modes below count under auto only
		snapshot := &Snapshot{Nodes: map[string]*NodeMetrics{}}
		unranked := &Snapshot{Nodes: map[string]*NodeMetrics{}} // the same nodes, judged without a memo
		for n := range 20 {
			name := fmt.Sprintf("node-%02d", n)
			devices := map[string][]Device{}
			for _, resource := range []string{shared, mig, other} {
				list := make([]Device, 2+rng.Intn(12))
				for j := range list {
					util := rng.Float64() * 0.9 // some above the 0.8 threshold
					list[j] = Device{Key: fmt.Sprintf("%d/%d", j/7, j%7+1), Util: util, Mem: util / 2, HasMem: true,
						Pods: rng.Intn(4), HasPods: true}
				}
				devices[resource] = list
			}
			snapshot.Nodes[name] = &NodeMetrics{Name: name, SampleTime: 100, Devices: devices}
			unranked.Nodes[name] = &NodeMetrics{Name: name, SampleTime: 100, Devices: devices}
		}
		snapshot.Rank(&policy)
		type question struct {
			node    string
			request []ResourceRequest
			assumed map[string]int
			modes   map[string]Mode
		}
		var questions []question
		for name := range snapshot.Nodes {
			for _, resource := range []string{shared, mig} {
				for count := 1; count <= memoCounts+1; count++ {
					for taken := 0; taken <= memoAssumed+1; taken += 1 + rng.Intn(3) {
						for _, mode := range []Mode{ModeSpread, ModePack} {
							assumed := map[string]int{}
							if taken > 0 {
								assumed[resource] = taken
							}
							if rng.Intn(3) == 0 {
								assumed[other] = 1 + rng.Intn(3) // read by interference alone
							}
							questions = append(questions, question{name, []ResourceRequest{{resource, count}}, assumed,
								map[string]Mode{resource: mode}})
						}
					}
				}
			}
		}
		for round := range 2 { // the first round fills the memo in a random order, the second reads it
			rng.Shuffle(len(questions), func(i, j int) { questions[i], questions[j] = questions[j], questions[i] })
			for _, q := range questions {
				metrics := snapshot.Nodes[q.node]
				want := Evaluate(q.node, unranked.Nodes[q.node], q.request, &policy, 100, q.assumed, q.modes, true)
				got := Evaluate(q.node, metrics, q.request, &policy, 100, q.assumed, q.modes, false)
				if got.Passed != want.Passed || got.Score != want.Score || got.Outcome != want.Outcome || got.Reason != "" {
					t.Fatalf("interference %g, round %d, %s %v assumed %v modes %v: memoized %+v, computed %+v",
						interference, round, q.node, q.request, q.assumed, q.modes, got, want)
				}
				// Filter asks again with the reason text when a node fails: from the memo too, word for word.
				if explained := Evaluate(q.node, metrics, q.request, &policy, 100, q.assumed, q.modes, true); explained != want {
					t.Fatalf("interference %g, round %d, %s %v assumed %v modes %v: memoized with reasons %+v, computed %+v",
						interference, round, q.node, q.request, q.assumed, q.modes, explained, want)
				}
			}
		}
		filled := 0
		for _, metrics := range snapshot.Nodes {
			for i := range metrics.ranked {
				if memo := metrics.ranked[i].memo.Load(); memo != nil {
					for j := range memo.words {
						if memo.words[j].Load()&memoSet != 0 {
							filled++
						}
					}
				}
			}
		}
		if filled == 0 {
			t.Fatalf("interference %g: no verdict was memoized", interference)
		}
		t.Logf("interference %g: %d questions, %d memo entries", interference, len(questions), filled)
	}
}
