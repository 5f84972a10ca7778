package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpufleet/mig/k8s/gpumetrics/remotewrite"
	"github.com/gpufleet/mig/k8s/gpumetrics/remotewrite/rwbench"
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
