package gpuscore

import (
	"fmt"
	"math"
	"testing"
)

// The recorded section of the vectors: packed series and sample times -> the extender's snapshot, node for node.
func TestVectorsRecorded(t *testing.T) {
	vectors := loadVectors(t)
	if len(vectors.Recorded) == 0 {
		t.Fatal("no recorded vectors: regenerate testdata/vectors.json")
	}
	for i, c := range vectors.Recorded {
		got := SnapshotFromRecorded(c.Series, c.Times, c.NodeNameLabels, c.QueriedAt, c.Now, c.MaxSkew, 1)
		compareSnapshot(t, fmt.Sprintf("recorded[%d]", i), got, c.Expect.Nodes, c.Expect.NewestSample)
	}
}

func TestDecodePackedSentinelsAndBrokenValues(t *testing.T) {
	labels := map[string]string{"Hostname": "n1", "gpu": "0"}
	got := decodePacked(labels, 950*utilScale+421*memoryScale+3)
	if len(got) != 3 || got[0].Value != 0.95 || !got[0].HasPods || got[0].Pods != 3 || got[1].Value != 421 || got[2].Value != 579 {
		t.Errorf("decoded %+v", got)
	}
	unknown := decodePacked(labels, 120*utilScale+memoryUnknown*memoryScale+podsUnknown)
	if len(unknown) != 1 || unknown[0].Value != 0.12 || unknown[0].HasPods {
		t.Errorf("sentinels decoded %+v", unknown)
	}
	for _, broken := range []float64{math.NaN(), math.Inf(1), -1, 1001 * utilScale, 500*utilScale + 1002*memoryScale, 5000421002.5, 1e20} {
		if got := decodePacked(labels, broken); len(got) != 1 || !math.IsNaN(got[0].Value) {
			t.Errorf("%v decoded %+v, want one NaN sample", broken, got)
		}
	}
}
