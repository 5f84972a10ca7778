// gpufleet-scheduler is kube-scheduler with the GPUScore plugin compiled in: the same flags and the same
// --config file, plus GPUScore and GPUClaimScore (DRA claims) as plugin names the configuration may enable.
package main

import (
	"os"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/gpufleet/mig/k8s/plugins/gpuclaimscore"
	"github.com/gpufleet/mig/k8s/plugins/gpuscore"
)

func main() {
	// The Go runtime's soft memory limit at 90 % of the container's (its cgroup's): at fleet scale GPUScore's
	// receiver holds every pushed series, and the heap, left to grow to twice its live size before a collection,
	// would reach the container's limit (an OOM kill) first. GOMEMLIMIT or AUTOMEMLIMIT in the environment win; no
	// cgroup limit, no change.
	if _, err := memlimit.Set(); err != nil {
		klog.ErrorS(err, "gpufleet-scheduler: GOMEMLIMIT left unset")
	}
	command := app.NewSchedulerCommand(
		app.WithPlugin(gpuscore.Name, gpuscore.New),
		app.WithPlugin(gpuclaimscore.Name, gpuclaimscore.New),
	)
	os.Exit(cli.Run(command))
}
