// Package metricstest provides a gpumetrics.Source that answers a fixed snapshot, and a small fleet to put in it,
// for the tests of the packages that read metrics (as net/http/httptest does for HTTP).
package metricstest

import (
	"context"
	"fmt"

	"github.com/gpufleet/mig/k8s/gpuscore"
)

// MIG is the resource the fleets below carry.
const MIG = "nvidia.com/mig-2g.20gb"

// Source answers Snapshot (numbered as asked) or Err, and counts the calls.
type Source struct {
	Snapshot *gpuscore.Snapshot
	Err      error
	Calls    int
}

// Fetch is gpumetrics.Source's.
func (f *Source) Fetch(_ context.Context, version uint64) (*gpuscore.Snapshot, error) {
	f.Calls++
	if f.Err != nil {
		return nil, f.Err
	}
	s := *f.Snapshot
	s.Version = version
	return &s, nil
}

// Fleet is node -> MIG instance loads (util; mem 0), sampled at now.
func Fleet(now float64, nodes map[string][]float64) *gpuscore.Snapshot {
	s := &gpuscore.Snapshot{Nodes: map[string]*gpuscore.NodeMetrics{}}
	for name, utils := range nodes {
		devices := make([]gpuscore.Device, len(utils))
		for i, u := range utils {
			devices[i] = gpuscore.Device{Key: fmt.Sprintf("0/%d", i), Util: u, HasMem: true}
		}
		s.Nodes[name] = &gpuscore.NodeMetrics{Name: name, SampleTime: now, Devices: map[string][]gpuscore.Device{MIG: devices}}
		s.Order = append(s.Order, name)
	}
	return s
}
