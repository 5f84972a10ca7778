package rwbench

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpufleet/mig/k8s/gpumetrics/remotewrite"
)

// Exposition is the traffic of a fleet read from dcgm-exporter's text, as Prometheus would send it after scraping
// it: each file one target's answer, given the scrape's target labels (job, instance, namespace; the exporter's
// own labels of those names renamed exported_*, as honor_labels false does) and then filtered as the roles'
// write_relabel_configs filter it (only the kept metrics, only the kept labels). Every interval sends the same
// values, stamped with the interval's start.
type Exposition struct {
	targets [][]remotewrite.TimeSeries // per target, in a stable order; Samples[0].Timestamp set per interval
}

// ReadExposition reads the targets' files; metrics are the names kept, keep the labels kept (every label when
// empty), job and namespace the scrape's target labels.
func ReadExposition(paths []string, job, namespace string, metrics, keep []string) (*Exposition, error) {
	if len(paths) == 0 {
		return nil, fmt.Errorf("no exposition file")
	}
	kept := map[string]bool{}
	for _, label := range keep {
		kept[label] = true
	}
	wanted := map[string]bool{}
	for _, metric := range metrics {
		wanted[metric] = true
	}
	exposition := &Exposition{}
	for k, path := range paths {
		file, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err := parser.TextToMetricFamilies(file)
		file.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		target := map[string]string{"job": job, "instance": "exposition-" + strconv.Itoa(k), "namespace": namespace}
		var series []remotewrite.TimeSeries
		for name, family := range families {
			if !wanted[name] {
				continue
			}
			for _, metric := range family.GetMetric() {
				value, ok := sampleValue(family.GetType(), metric)
				if !ok {
					continue
				}
				labels := map[string]string{"__name__": name}
				for _, pair := range metric.GetLabel() {
					labels[pair.GetName()] = pair.GetValue()
				}
				for label, targetValue := range target {
					if own, clash := labels[label]; clash {
						labels["exported_"+label] = own
					}
					labels[label] = targetValue
				}
				var sorted []remotewrite.Label
				for label, v := range labels {
					if len(keep) == 0 || kept[label] || label == "__name__" {
						sorted = append(sorted, remotewrite.Label{Name: label, Value: v})
					}
				}
				slices.SortFunc(sorted, func(a, b remotewrite.Label) int { return strings.Compare(a.Name, b.Name) })
				series = append(series, remotewrite.TimeSeries{Labels: sorted, Samples: []remotewrite.Sample{{Value: value}}})
			}
		}
		slices.SortStableFunc(series, func(a, b remotewrite.TimeSeries) int { return slices.CompareFunc(a.Labels, b.Labels, compareLabels) })
		exposition.targets = append(exposition.targets, series)
	}
	return exposition, nil
}

func sampleValue(kind dto.MetricType, metric *dto.Metric) (float64, bool) {
	switch kind {
	case dto.MetricType_GAUGE:
		return metric.GetGauge().GetValue(), true
	case dto.MetricType_COUNTER:
		return metric.GetCounter().GetValue(), true
	case dto.MetricType_UNTYPED:
		return metric.GetUntyped().GetValue(), true
	}
	return math.NaN(), false
}

func compareLabels(a, b remotewrite.Label) int {
	if c := strings.Compare(a.Name, b.Name); c != 0 {
		return c
	}
	return strings.Compare(a.Value, b.Value)
}

// SeriesPerInterval is how many series (one sample each) an interval sends.
func (e *Exposition) SeriesPerInterval() int {
	total := 0
	for _, target := range e.targets {
		total += len(target)
	}
	return total
}

// Requests are the bodies of one interval sampled at ms, perSend series each at most, the targets in order (the
// same values every interval).
func (e *Exposition) Requests(ms int64, _, perSend int) [][]byte {
	var bodies [][]byte
	var raw []byte
	var batch []remotewrite.TimeSeries
	for _, target := range e.targets {
		for _, series := range target {
			series.Samples = []remotewrite.Sample{{Value: series.Samples[0].Value, Timestamp: ms}}
			batch = append(batch, series)
			if len(batch) == perSend {
				raw = remotewrite.AppendWriteRequest(raw[:0], batch)
				bodies = append(bodies, remotewrite.Compress(nil, raw))
				batch = batch[:0]
			}
		}
	}
	if len(batch) > 0 {
		raw = remotewrite.AppendWriteRequest(raw[:0], batch)
		bodies = append(bodies, remotewrite.Compress(nil, raw))
	}
	return bodies
}
