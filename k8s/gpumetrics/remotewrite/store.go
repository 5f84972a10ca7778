package remotewrite

// The Store: the kept series, per node, as their newest samples. A request is applied whole under the Store's
// lock once it decoded; a sample older than the one held for its series is ignored (out of order), Prometheus'
// stale marker removes the series, and a series without a sample for seriesExpiry is dropped as Prometheus' own
// lookback drops it from an instant query. Sources (one per Refresher) build snapshots from it: a node is rebuilt
// only when a sample of it arrived since that Source's last snapshot, through the same fold and screening as the
// pull form's (gpuscore.NodeFromSamples, gpuscore.SnapshotOfNodes). A node's layout (its devices, which series
// gives each its values: gpuscore.LayoutOfNode) is kept while its series stay the same, so that new samples cost
// only their values' fold.

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/gpufleet/mig/k8s/gpuscore"
)

// seriesExpiry is how long a series without a new sample stays (Prometheus' default lookback delta: the pull form's
// instant query stops returning a series this long after its last sample).
const seriesExpiry = 5 * time.Minute

// MaxSeries is how many series a Store holds at most: 2.5 times a fleet of 5,000 nodes x 8 GPUs x 7 MIG instances
// x 4 metrics, so that a sender whose relabelling lets through what it should not (a label that changes with
// every scrape) cannot grow the scheduler's memory without bound. A new series beyond it is not kept and is
// counted (remote_write_series_over_limit_total); the series already held keep their samples. The settings
// contract's receivers.maxSeries, which the extender's receiver reads (a test checks the two agree).
const MaxSeries = 2_800_000

// Store holds the newest sample of every kept series. Safe for concurrent use.
type Store struct {
	mu         sync.Mutex
	filter     filter
	nodeLabels []string // args' nodeNameLabels, all of them (the filter reads the first maxNodeLabels)
	maxSkew    float64
	now        func() float64 // unix seconds; the wall clock outside tests

	nodes     map[string]*nodeState
	order     []*nodeState // nodes in the order their first sample came
	held      int          // series held, every node's
	maxSeries int
	gen       uint64 // bumped by each change
	key       []byte // scratch: a series' key
	// intern shares resource names between the nodes' layouts (gpuscore.LayoutOfNode).
	intern map[string]string

	firstSample     chan struct{} // closed when the first sample is kept
	firstSampleOnce sync.Once
}

type nodeState struct {
	name    string
	devices map[string]*deviceState // by the values of the kept labels but the metric's name
	held    int                     // series held
	list    []*seriesState          // the series held in the order they came (removed ones until the next build)
	newest  int64                   // the newest sample's timestamp, milliseconds
	changed uint64                  // Store.gen of the last change
	// layout is the fold of list's series without their values, made when shape was layoutShape; shape counts
	// the series added to the node and removed from it.
	layout             *gpuscore.NodeLayout
	shape, layoutShape uint64
}

// deviceState is the series whose kept labels are the same but for the metric's name: a device's, one per metric the
// decision reads. They share one map of labels, made once: at 5,000 nodes a map per series was most of the
// scheduler's heap (199 of 435 MB in use).
type deviceState struct {
	key    string
	labels map[string]string
	series []*seriesState // by the metric's index
	held   int
}

type seriesState struct {
	sample    gpuscore.Sample // the labels a decision reads (its device's), the metric, the newest value
	timestamp int64           // milliseconds
	device    *deviceState
	metric    int
	removed   bool
}

// remove forgets a held series.
func (node *nodeState) remove(held *seriesState) {
	device := held.device
	device.series[held.metric] = nil
	if device.held--; device.held == 0 {
		delete(node.devices, device.key)
	}
	node.held--
	held.removed = true
}

// NewStore keeps the series of the dcgm metrics a decision reads, from the exporter's job and namespace when they
// are set; nodeLabels name a series' node (the first one set); a node dated more than maxSkew seconds ahead of this
// clock is left out of snapshots until it no longer is.
func NewStore(nodeLabels []string, job, namespace string, maxSkew float64) *Store {
	kept := nodeLabels
	if len(kept) > maxNodeLabels {
		kept = kept[:maxNodeLabels]
	}
	return &Store{
		filter:      filter{metrics: gpuscore.DCGMMetrics(), nodeLabels: kept, job: job, namespace: namespace},
		nodeLabels:  append([]string(nil), nodeLabels...),
		maxSkew:     maxSkew,
		now:         func() float64 { return float64(time.Now().UnixNano()) / 1e9 },
		nodes:       map[string]*nodeState{},
		intern:      map[string]string{},
		maxSeries:   MaxSeries,
		firstSample: make(chan struct{}),
	}
}

// FirstSample is closed once the Store has kept a sample: until then a snapshot of it says nothing of the fleet.
func (st *Store) FirstSample() <-chan struct{} { return st.firstSample }

// Nodes is how many nodes the Store holds samples of.
func (st *Store) Nodes() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.nodes)
}

// applied is what one request did to the Store.
type applied struct{ accepted, outOfOrder, removed, overLimit int }

// apply writes a decoded request's samples into the Store.
func (st *Store) apply(d *decoded) applied {
	var result applied
	st.mu.Lock()
	defer st.mu.Unlock()
	gen := st.gen + 1
	labels := labelNode + len(st.filter.nodeLabels)
	for i := range d.kept {
		s := &d.kept[i]
		nodeName := d.node(s, len(st.filter.nodeLabels))
		node := st.nodes[string(nodeName)]
		key := st.key[:0]
		for label := labelName + 1; label < labels; label++ {
			key = append(append(key, d.value(s, label)...), 0xff)
		}
		st.key = key
		var device *deviceState
		var held *seriesState
		if node != nil {
			if device = node.devices[string(key)]; device != nil {
				held = device.series[s.metric]
			}
		}
		_ = eachSample(d.body[s.samples.start:s.samples.end], func(value float64, timestamp int64) {
			if held != nil && timestamp < held.timestamp {
				result.outOfOrder++
				return
			}
			if math.Float64bits(value) == staleNaN {
				if held != nil {
					node.remove(held)
					held = nil
					node.changed = gen
					node.shape++
					st.held--
					result.removed++
				}
				return
			}
			if held == nil && st.held >= st.maxSeries {
				result.overLimit++
				return
			}
			if node == nil {
				node = &nodeState{name: string(nodeName), devices: map[string]*deviceState{}}
				st.nodes[node.name] = node
				st.order = append(st.order, node)
			}
			if held == nil {
				if device == nil || device.held == 0 { // none yet, or its last series removed by this request
					device = &deviceState{key: string(key), labels: d.labels(s, &st.filter), series: make([]*seriesState, len(st.filter.metrics))}
					node.devices[device.key] = device
				}
				held = &seriesState{sample: gpuscore.Sample{Name: st.filter.metrics[s.metric], Labels: device.labels}, device: device, metric: s.metric}
				device.series[s.metric] = held
				device.held++
				node.held++
				node.list = append(node.list, held)
				node.shape++
				st.held++
			}
			held.sample.Value, held.timestamp = value, timestamp
			node.newest = max(node.newest, timestamp)
			node.changed = gen
			result.accepted++
		})
	}
	if result.accepted > 0 || result.removed > 0 {
		st.gen = gen
	}
	if result.accepted > 0 {
		st.firstSampleOnce.Do(func() { close(st.firstSample) })
	}
	return result
}

// labels is a kept series' labels as gpuscore.Sample carries them, made once per series: those the fold reads
// (gpuscore.DecisionLabels and the node's), less the ones it cannot read, so that the map stays small enough for Go's
// small-map lookups: __name__ (Sample.Name has it), job (the filter read it), and pod and namespace when the series
// has exported_pod (the fold then takes exported_pod and exported_namespace).
func (d *decoded) labels(s *series, f *filter) map[string]string {
	labels := make(map[string]string, 8)
	exported := len(d.value(s, labelExportedPod)) > 0
	for i, name := range fixedLabels {
		switch {
		case i == labelName || i == labelJob:
			continue
		case exported && (i == labelPod || i == labelNamespace):
			continue
		}
		if v := d.value(s, i); len(v) > 0 {
			labels[name] = string(v)
		}
	}
	for i, name := range f.nodeLabels {
		if v := d.value(s, labelNode+i); len(v) > 0 {
			labels[name] = string(v)
		}
	}
	return labels
}

// Source is one reader of the Store (a Refresher's gpumetrics.Source): the nodes it built for its last snapshot,
// kept until a sample of theirs arrives. Only its Refresher calls Fetch.
type Source struct {
	store      *Store
	seen       uint64 // Store.gen of the last snapshot
	built      map[string]builtNode
	futureLeft bool // the last snapshot left a node out as dated ahead: the next one judges it again
	samples    []gpuscore.Sample
	values     []float64
}

type builtNode struct {
	metrics *gpuscore.NodeMetrics // nil: nothing of the node passed
	gen     uint64
}

// NewSource is a new reader of st.
func (st *Store) NewSource() *Source { return &Source{store: st, built: map[string]builtNode{}} }

// FirstSample is the Store's: closed once it has kept a sample.
func (src *Source) FirstSample() <-chan struct{} { return src.store.FirstSample() }

// Nodes is the Store's: how many nodes it holds samples of.
func (src *Source) Nodes() int { return src.store.Nodes() }

// Fetch is the snapshot numbered version of what the Store holds now, nil when nothing changed since the last
// one: no sample arrived, no series expired, no node was left out as dated ahead. No network, and only the nodes
// that changed are folded again.
func (src *Source) Fetch(_ context.Context, version uint64) (*gpuscore.Snapshot, error) {
	st := src.store
	st.mu.Lock()
	now := st.now()
	cutoff := int64(math.Floor((now - seriesExpiry.Seconds()) * 1000))
	if st.gen == src.seen && !src.futureLeft && !st.expires(cutoff) {
		st.mu.Unlock()
		return nil, nil
	}
	st.expire(cutoff)
	nodes := make([]*gpuscore.NodeMetrics, 0, len(st.order))
	for _, node := range st.order {
		built, ok := src.built[node.name]
		if !ok || built.gen != node.changed {
			built = builtNode{src.build(node, cutoff), node.changed}
			src.built[node.name] = built
		}
		if built.metrics != nil {
			nodes = append(nodes, built.metrics)
		}
	}
	if len(src.built) > 2*len(st.order)+64 { // nodes gone: forget what was built for them
		for name := range src.built {
			if node := st.nodes[name]; node == nil {
				delete(src.built, name)
			}
		}
	}
	src.seen = st.gen
	st.mu.Unlock()
	snapshot := gpuscore.SnapshotOfNodes(nodes, now, st.maxSkew, version)
	src.futureLeft = len(snapshot.Nodes) < len(nodes)
	return snapshot, nil
}

// build folds node's series into its NodeMetrics, those without a sample since cutoff (milliseconds) dropped; called
// with the Store locked. With every value finite and in its metric's range (a healthy exporter's), the node's
// layout folds the values; else the whole fold runs, which leaves out what it screens.
func (src *Source) build(node *nodeState, cutoff int64) *gpuscore.NodeMetrics {
	samples, values, list := src.samples[:0], src.values[:0], node.list[:0]
	screened := true
	for _, held := range node.list {
		if held.timestamp < cutoff && !held.removed {
			node.remove(held) // as Prometheus' lookback forgets it
			node.shape++
			src.store.held--
		}
		if !held.removed {
			samples = append(samples, held.sample)
			values = append(values, held.sample.Value)
			list = append(list, held)
			screened = screened && gpuscore.FoldsAsLaidOut(held.sample.Name, held.sample.Value)
		}
	}
	clear(node.list[len(list):])
	node.list = list
	src.samples, src.values = samples[:0], values[:0]
	if len(samples) == 0 {
		return nil
	}
	sampleTime := float64(node.newest) / 1000
	if !screened {
		return gpuscore.NodeFromSamples(samples, node.name, sampleTime, src.store.nodeLabels)
	}
	if node.layoutShape != node.shape { // shape is at least 1 once the node has a series: the first build lays out
		node.layout, node.layoutShape = gpuscore.LayoutOfNode(samples, src.store.nodeLabels, src.store.intern), node.shape
	}
	if node.layout == nil { // its series make no device (no utilisation, no resource)
		return nil
	}
	return node.layout.Node(values, sampleTime)
}

// expires says whether a node's newest sample is older than cutoff (milliseconds).
func (st *Store) expires(cutoff int64) bool {
	for _, node := range st.order {
		if node.newest < cutoff {
			return true
		}
	}
	return false
}

// expire removes the nodes whose newest sample is older than cutoff, and those left without a series (stale
// markers); with the Store locked. A live node's expired series are left out, and dropped, by build.
func (st *Store) expire(cutoff int64) {
	kept := st.order[:0]
	for _, node := range st.order {
		if node.newest < cutoff || node.held == 0 {
			delete(st.nodes, node.name)
			st.held -= node.held
			st.gen++
			continue
		}
		kept = append(kept, node)
	}
	clear(st.order[len(kept):])
	st.order = kept
}
