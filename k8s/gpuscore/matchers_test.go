package gpuscore

import (
	"strings"
	"testing"
	"time"
)

// The plugin's queries carry the same pins as the extender's (exporter_matchers): a tenant's exporter, scraped
// under another job or namespace, cannot feed the plugin.
func TestQueriesArePinnedToTheExportersJobAndNamespace(t *testing.T) {
	matchers := ExporterMatchers("dcgm-exporter", "gpufleet-node-agents")
	if matchers != `job="dcgm-exporter",namespace="gpufleet-node-agents"` {
		t.Fatalf("matchers: %s", matchers)
	}
	source := NewPrometheusSource("http://p.invalid", []string{"Hostname"}, time.Second, 5, matchers)
	if !strings.HasSuffix(source.seriesQuery, `",`+matchers+`}`) {
		t.Errorf("series query not pinned: %s", source.seriesQuery)
	}
	if strings.Count(source.timesQuery, "{"+matchers+"}") != len(DCGMMetrics) {
		t.Errorf("times query not pinned per metric: %s", source.timesQuery)
	}
	if ExporterMatchers("", "") != "" || ExporterMatchers("", "n") != `namespace="n"` {
		t.Error("unpinned labels must be left out")
	}
	if open := NewPrometheusSource("http://p.invalid", []string{"Hostname"}, time.Second, 5, ""); strings.Contains(open.timesQuery, "{") {
		t.Errorf("unpinned times query: %s", open.timesQuery)
	}
}
