package gpumetrics

import (
	"strings"
	"testing"
	"time"

	"github.com/gpufleet/mig/k8s/gpuscore"
)

// The plugin's queries carry the same pins as the extender's (exporter_matchers): a tenant's exporter, scraped
// under another job or namespace, cannot feed the plugin.
func TestQueriesArePinnedToTheExportersJobAndNamespace(t *testing.T) {
	matchers := gpuscore.ExporterMatchers("dcgm-exporter", "gpufleet-node-agents")
	if matchers != `job="dcgm-exporter",namespace="gpufleet-node-agents"` {
		t.Fatalf("matchers: %s", matchers)
	}
	source := newPrometheusSource("http://p.invalid", []string{"Hostname"}, time.Second, 5, matchers)
	if !strings.HasSuffix(source.seriesQuery, `",`+matchers+`})`) {
		t.Errorf("series query not pinned: %s", source.seriesQuery)
	}
	if strings.Count(source.timesQuery, "{"+matchers+"}") != 1 {
		t.Errorf("times query not pinned: %s", source.timesQuery)
	}
	if gpuscore.ExporterMatchers("", "") != "" || gpuscore.ExporterMatchers("", "n") != `namespace="n"` {
		t.Error("unpinned labels must be left out")
	}
	if open := newPrometheusSource("http://p.invalid", []string{"Hostname"}, time.Second, 5, ""); strings.Contains(open.timesQuery, "{") {
		t.Errorf("unpinned times query: %s", open.timesQuery)
	}
}

// The queries are the extender's, word for word (extender/tests/test_metrics_source.py asserts the same text).
func TestQueriesAreTheExtenders(t *testing.T) {
	series, times := gpuscore.PrometheusQueries([]string{"node", "Hostname"}, "")
	want := `max by (__name__, node, Hostname, gpu, UUID, GPU_I_ID, GPU_I_PROFILE, pod, namespace, exported_pod, ` +
		`exported_namespace) ({__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_PROF_GR_ENGINE_ACTIVE|DCGM_FI_DEV_FB_USED|DCGM_FI_DEV_FB_FREE"})`
	if series != want {
		t.Errorf("series query:\n got %s\nwant %s", series, want)
	}
	if times != "max by (node, Hostname) (timestamp(DCGM_FI_DEV_FB_FREE))" {
		t.Errorf("times query: %s", times)
	}
}
