// Package gpuscore is GPUScore, a kube-scheduler framework plugin that places GPU and MIG pods by device load,
// deciding exactly as the gpufleet extender does (k8s/gpuscore is the decision, held to scoring.py by its vectors;
// k8s/gpumetrics reads the metrics).
//
// Extension points:
//   - PreFilter: works out the pod's GPU request (Skip for pods without one: they cost nothing) and takes one
//     view of metrics, in-flight pods and auto modes for the whole cycle;
//   - Filter: the threshold rule, tenant pools, the missing/stale-metrics policy;
//   - PreScore/Score: the extender's 0..10 score x 10 = 0..100 (fwk.MaxNodeScore). kube-scheduler multiplies an
//     extender's 0..10 by its weight and by 10 (MaxNodeScore / MaxExtenderPriority), a plugin's 0..100 by its
//     weight: GPUScore with weight w adds to a node's total exactly what the extender with weight w adds. The
//     scores are absolute (a node's score does not depend on the other candidates), so no NormalizeScore;
//   - Reserve/Unreserve: in-flight accounting from the scheduler's own assumptions;
//   - SignPod: GPU pods are never batched (each placement changes the next pod's scores).
package gpuscore

import (
	"context"

	"github.com/gpufleet/mig/k8s/gpumetrics"
	"github.com/gpufleet/mig/k8s/gpuscore"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
)

// Name is the plugin's name in the KubeSchedulerConfiguration.
const Name = "GPUScore"

const stateKey fwk.StateKey = Name

// GPUScore is the plugin.
type GPUScore struct {
	args       gpuscore.Args
	policy     gpuscore.Policy
	metrics    *gpumetrics.Refresher
	inflight   *Inflight
	namespaces corelisters.NamespaceLister // nil with tenantPools off
	recorder   events.EventRecorder        // nil without a framework handle (unit tests)
	clock      func() float64
}

var (
	_ fwk.PreFilterPlugin = (*GPUScore)(nil)
	_ fwk.FilterPlugin    = (*GPUScore)(nil)
	_ fwk.PreScorePlugin  = (*GPUScore)(nil)
	_ fwk.ScorePlugin     = (*GPUScore)(nil)
	_ fwk.ReservePlugin   = (*GPUScore)(nil)
	_ fwk.SignPlugin      = (*GPUScore)(nil)
)

// New builds GPUScore from its args; invalid args stop the scheduler with the list of problems.
func New(ctx context.Context, obj runtime.Object, handle fwk.Handle) (fwk.Plugin, error) {
	args, metrics, err := gpumetrics.StartMetrics(ctx, obj, Name)
	if err != nil {
		return nil, err
	}
	plugin := newPluginOn(args, metrics)
	if handle != nil {
		plugin.watch(handle)
		plugin.recorder = handle.EventRecorder()
	}
	return plugin, nil
}

func newPlugin(args gpuscore.Args, source gpumetrics.Source) *GPUScore {
	return newPluginOn(args, gpumetrics.NewRefresher(source, gpumetrics.Seconds(args.MetricsRefreshSeconds), args.Policy()))
}

func newPluginOn(args gpuscore.Args, metrics *gpumetrics.Refresher) *GPUScore {
	return &GPUScore{
		args:     args,
		policy:   args.Policy(),
		metrics:  metrics,
		inflight: NewInflight(args.InflightMaxSeconds),
		clock:    gpumetrics.Now,
	}
}

// watch feeds in-flight accounting with every bound GPU pod (bound by anyone, as the extender's pod watch) and
// reads namespaces' tenant labels, both from the scheduler's shared informers.
func (g *GPUScore) watch(handle fwk.Handle) {
	factory := handle.SharedInformerFactory()
	if factory == nil {
		return
	}
	if g.args.TenantPools {
		g.namespaces = factory.Core().V1().Namespaces().Lister()
	}
	observe := func(obj any, deleted bool) {
		if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tombstone.Obj
		}
		if pod, ok := obj.(*v1.Pod); ok {
			g.inflight.Observe(pod, deleted, g.clock())
		}
	}
	_, err := factory.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { observe(obj, false) },
		UpdateFunc: func(_, obj any) { observe(obj, false) },
		DeleteFunc: func(obj any) { observe(obj, true) },
	})
	if err != nil {
		klog.Background().Error(err, "GPUScore: cannot watch pods; in-flight accounting sees only this scheduler's pods")
	}
}

func (g *GPUScore) Name() string { return Name }

// cycleState is everything a verdict depends on besides the node, fixed for one scheduling cycle.
type cycleState struct {
	request         []gpuscore.ResourceRequest
	view            *gpumetrics.View
	assumed         map[string]map[string]int
	now             float64
	tenantCheck     bool
	namespace       string
	namespaceTenant string
}

// Clone: the state is never changed after PreFilter.
func (c *cycleState) Clone() fwk.StateData { return c }

func (g *GPUScore) PreFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	request := gpuscore.PodGPURequest(pod)
	if len(request) == 0 {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	view := g.metrics.View()
	now := g.clock()
	if reason := g.metrics.BlindReason(); reason != "" && g.recorder != nil && g.metrics.BlindEventDue(now) {
		// Where operators look first: the pod. One event per blindWarnEvery, not one per pod.
		g.recorder.Eventf(pod, nil, v1.EventTypeWarning, gpumetrics.EventReasonBlind, "Scheduling",
			"GPUScore places GPU pods without GPU metrics (onMissingMetrics %s): %s", g.policy.MissingPolicyName(), reason)
	}
	data := &cycleState{
		request:   request,
		view:      view,
		assumed:   g.inflight.Assumed(view.Snapshot, now),
		now:       now,
		namespace: pod.Namespace,
	}
	if g.namespaces != nil {
		// Like the extender: tenant pools apply once the namespace is known; an unknown one is not refused.
		if ns, err := g.namespaces.Get(pod.Namespace); err == nil {
			data.tenantCheck = true
			data.namespaceTenant = ns.Labels[g.args.TenantLabel]
		}
	}
	state.Write(stateKey, data)
	return nil, nil
}

func (g *GPUScore) PreFilterExtensions() fwk.PreFilterExtensions { return nil }

func readState(state fwk.CycleState) *cycleState {
	data, err := state.Read(stateKey)
	if err != nil {
		return nil
	}
	s, _ := data.(*cycleState)
	return s
}

// verdict is the extender's verdict_of: the tenant rule first, then scoring.evaluate_node (with the reason text
// only when reasons is set).
func (g *GPUScore) verdict(s *cycleState, node *v1.Node, reasons bool) gpuscore.Verdict {
	name := node.Name
	if s.tenantCheck {
		if reason := gpuscore.TenantMismatch(name, node.Labels[g.args.TenantLabel], s.namespace, s.namespaceTenant); reason != "" {
			return gpuscore.Verdict{Passed: false, Score: gpuscore.MinScore, Outcome: gpuscore.OutcomeTenantMismatch, Reason: reason}
		}
	}
	snapshot := s.view.Snapshot
	return gpuscore.Evaluate(name, snapshot.Nodes[name], s.request, &g.policy, s.now, s.assumed[name], s.view.Modes, reasons)
}

func (g *GPUScore) Filter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) *fwk.Status {
	s := readState(state)
	node := nodeInfo.Node()
	if s == nil || node == nil {
		return nil
	}
	if g.verdict(s, node, false).Passed {
		return nil
	}
	v := g.verdict(s, node, true) // again, with the reason text: only failing nodes pay for it
	if v.Outcome == gpuscore.OutcomeTenantMismatch {
		// Preempting pods cannot move a node into another tenant's pool.
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, v.Reason)
	}
	return fwk.NewStatus(fwk.Unschedulable, v.Reason)
}

func (g *GPUScore) PreScore(ctx context.Context, state fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) *fwk.Status {
	if readState(state) == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	return nil
}

// ScoreScale maps the extender's 0..10 onto the framework's 0..100.
const ScoreScale = fwk.MaxNodeScore / gpuscore.MaxScore

func (g *GPUScore) Score(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) (int64, *fwk.Status) {
	s := readState(state)
	node := nodeInfo.Node()
	if s == nil || node == nil {
		return gpuscore.NeutralScore * ScoreScale, nil
	}
	return int64(g.verdict(s, node, false).Score) * ScoreScale, nil
}

func (g *GPUScore) ScoreExtensions() fwk.ScoreExtensions { return nil }

func (g *GPUScore) Reserve(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	if s := readState(state); s != nil {
		g.inflight.Reserve(pod.UID, nodeName, s.request, g.clock())
	}
	return nil
}

func (g *GPUScore) Unreserve(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) {
	g.inflight.Unreserve(pod.UID)
}

// SignPod lets pods without GPUs be batched (GPUScore is neutral to them) and keeps GPU pods out of batches:
// each placement changes the in-flight load the next pod is scored against.
func (g *GPUScore) SignPod(ctx context.Context, pod *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	if len(gpuscore.PodGPURequest(pod)) == 0 {
		return nil, nil
	}
	return nil, fwk.NewStatus(fwk.Unschedulable, "GPU pods are scored against in-flight load")
}
