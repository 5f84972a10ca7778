package gpuscore

import (
	"context"
	"fmt"
	"math/rand"
	"testing"

	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
)

// BenchmarkCycle is one GPU pod's PreFilter + Filter + Score over 1,000 nodes of 24 MIG instances each (the
// issue's fleet), the work GPUScore adds to a scheduling cycle; ns/op / 1000 is the cost per node.
func BenchmarkCycle(b *testing.B) {
	const nodes, instances = 1000, 24
	rng := rand.New(rand.NewSource(1))
	loads := map[string][]float64{}
	names := make([]string, nodes)
	for i := range names {
		names[i] = fmt.Sprintf("node-%04d", i)
		utils := make([]float64, instances)
		for j := range utils {
			utils[j] = rng.Float64()
		}
		loads[names[i]] = utils
	}
	now := 1000.0
	g := newPlugin(DefaultArgs(), &fakeSource{snapshot: fleet(now, loads)})
	g.clock = func() float64 { return now }
	g.metrics.RefreshOnce(context.Background())
	infos := make([]fwk.NodeInfo, nodes)
	for i, name := range names {
		infos[i] = nodeInfo(name, nil)
	}
	ctx := context.Background()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		// A new pod each cycle, reserved on a node: in-flight accounting grows as in a burst.
		pod := migPod(fmt.Sprintf("p%d", i), 1)
		state := framework.NewCycleState()
		g.PreFilter(ctx, state, pod, nil)
		for _, info := range infos {
			if g.Filter(ctx, state, pod, info).IsSuccess() {
				g.Score(ctx, state, pod, info)
			}
		}
		g.Reserve(ctx, state, pod, names[i%nodes])
		i++
	}
}
