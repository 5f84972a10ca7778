package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpufleet/mig/k8s/gpumetrics/remotewrite"
	"github.com/gpufleet/mig/k8s/gpumetrics/remotewrite/rwbench"
	"github.com/gpufleet/mig/k8s/gpuscore"
)

// The sender against the receiver over the network: two intervals of a small fleet, every node and device landed.
func TestTheSenderFillsAReceiver(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("sender-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fleet := rwbench.DefaultFleet(12)
	store := remotewrite.NewStore([]string{"Hostname", "hostname"}, fleet.Job, fleet.Namespace, 5)
	address, err := remotewrite.NewReceiver(store, token).Serve(ctx, "127.0.0.1:0", "", "")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + address.String() + remotewrite.Path
	if err := run(url, token, "", fleet, 300*time.Millisecond, 500, 2, 2); err != nil {
		t.Fatal(err)
	}
	snapshot, err := store.NewSource().Fetch(ctx, 1)
	if err != nil || snapshot == nil {
		t.Fatalf("Fetch: %v, %v", snapshot, err)
	}
	devices := 0
	for _, node := range snapshot.Nodes {
		devices += len(node.Devices["nvidia.com/mig-1g.10gb"])
	}
	if len(snapshot.Nodes) != 12 || devices != 12*8*7 {
		t.Errorf("%d nodes, %d devices landed; 12 and %d sent", len(snapshot.Nodes), devices, 12*8*7)
	}
	if err := run(url, token+"-missing", "", fleet, time.Second, 500, 2, 1); err == nil {
		t.Error("a sender without its token file ran")
	}
}

// An exporter's text, sent as Prometheus would scrape, relabel and send it: every device lands with its values,
// its pods (the exporter's namespace renamed exported_namespace beside the target's) and its node's host label.
func TestTheSenderSendsAnExposition(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("sender-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	shard := filepath.Join(dir, "shard-0.txt")
	text := `# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge
DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_PROFILE="1g.10gb",GPU_I_ID="1",gpu="0",UUID="GPU-a0",Hostname="node-a",pod="job-1",namespace="tenant-a"} 0.95
DCGM_FI_DEV_FB_USED{GPU_I_PROFILE="1g.10gb",GPU_I_ID="1",gpu="0",UUID="GPU-a0",Hostname="node-a",pod="job-1",namespace="tenant-a"} 7500
DCGM_FI_DEV_FB_FREE{GPU_I_PROFILE="1g.10gb",GPU_I_ID="1",gpu="0",UUID="GPU-a0",Hostname="node-a",pod="job-1",namespace="tenant-a"} 2500
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a0",Hostname="node-a"} 41
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b1",hostname="node-b"} 20
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="1",UUID="GPU-b1",hostname="node-b"} 0.2
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-b1",hostname="node-b"} 0
DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-b1",hostname="node-b"} 81559
`
	if err := os.WriteFile(shard, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	keep := []string{"__name__", "Hostname", "hostname", "gpu", "UUID", "GPU_I_ID", "GPU_I_PROFILE", "pod", "namespace",
		"exported_pod", "exported_namespace", "job", "instance"}
	exposition, err := rwbench.ReadExposition([]string{shard}, "dcgm-exporter", "gpufleet-node-agents", gpuscore.DCGMMetrics(), keep)
	if err != nil {
		t.Fatal(err)
	}
	if exposition.SeriesPerInterval() != 7 {
		t.Fatalf("%d series kept, want the 7 of the dcgm metrics a decision reads", exposition.SeriesPerInterval())
	}
	store := remotewrite.NewStore([]string{"Hostname", "hostname"}, "dcgm-exporter", "gpufleet-node-agents", 5)
	address, err := remotewrite.NewReceiver(store, token).Serve(ctx, "127.0.0.1:0", "", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := run("http://"+address.String()+remotewrite.Path, token, "", exposition, 200*time.Millisecond, 3, 2, 1); err != nil {
		t.Fatal(err)
	}
	snapshot, err := store.NewSource().Fetch(ctx, 1)
	if err != nil || snapshot == nil {
		t.Fatalf("Fetch: %v, %v", snapshot, err)
	}
	a := snapshot.Nodes["node-a"].Devices["nvidia.com/mig-1g.10gb"]
	b := snapshot.Nodes["node-b"].Devices["nvidia.com/gpu"]
	if len(a) != 1 || a[0].Util != 0.95 || a[0].Mem != 0.75 || !a[0].HasPods || a[0].Pods != 1 {
		t.Errorf("node-a: %+v", a)
	}
	if len(b) != 1 || b[0].Util != 0.2 || b[0].Mem != 0 || !b[0].HasMem {
		t.Errorf("node-b: %+v", b)
	}
	if _, err := rwbench.ReadExposition([]string{filepath.Join(dir, "missing.txt")}, "j", "n", nil, nil); err == nil {
		t.Error("a missing exposition file was read")
	}
}
