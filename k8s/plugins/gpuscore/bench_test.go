package gpuscore

import (
	"context"
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"github.com/gpufleet/mig/k8s/gpuscore"

	"github.com/gpufleet/mig/k8s/gpumetrics/metricstest"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
)

// BenchmarkCycle is one GPU pod's PreFilter + Filter + Score over 1,000 nodes, the work GPUScore adds to a
// scheduling cycle; ns/op / 1000 is the cost per node. "exclusive": 24 MIG instances a node (the fleet);
// "shared": 56 instances time-sliced 4 ways with 0-3 pods each (finnlp's 1g.10gb in the lab, the bench-scheduler
// pods' resource), scored by the device plugin's choice.
func BenchmarkCycle(b *testing.B) {
	b.Run("exclusive", func(b *testing.B) { benchmarkCycle(b, 24, 1) })
	b.Run("shared", func(b *testing.B) { benchmarkCycle(b, 56, 4) })
}

func benchmarkCycle(b *testing.B, instances, replicas int) {
	const nodes = 1000
	rng := rand.New(rand.NewSource(1))
	now := 1000.0
	snapshot := &gpuscore.Snapshot{Nodes: map[string]*gpuscore.NodeMetrics{}}
	names := make([]string, nodes)
	for i := range names {
		names[i] = fmt.Sprintf("node-%04d", i)
		devices := make([]gpuscore.Device, instances)
		for j := range devices {
			// As tests/dcgm_fleet.py loads bench-scheduler's fleet: every tenth node hot, the others 0..0.7.
			util := rng.Float64() * 0.7
			if i%10 == 9 {
				util = 0.95
			}
			devices[j] = gpuscore.Device{Key: fmt.Sprintf("%d/%d", j/7, j%7+1), Util: util, Mem: util, HasMem: true,
				Pods: rng.Intn(replicas), HasPods: true}
		}
		snapshot.Nodes[names[i]] = &gpuscore.NodeMetrics{Name: names[i], SampleTime: now, Devices: map[string][]gpuscore.Device{mig: devices}}
		snapshot.Order = append(snapshot.Order, names[i])
	}
	args := gpuscore.DefaultArgs()
	if replicas > 1 {
		args.SharedResources = map[string]int{mig: replicas}
	}
	g := newPlugin(args, &metricstest.Source{Snapshot: snapshot})
	g.clock = func() float64 { return now }
	g.metrics.RefreshOnce(context.Background())
	infos := make([]fwk.NodeInfo, nodes)
	for i, name := range names {
		// The scheduler's Node names are not the snapshot's strings: a lookup compares the bytes, as it does there.
		infos[i] = nodeInfo(strings.Clone(name), nil)
	}
	ctx := context.Background()
	b.ReportAllocs()
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
