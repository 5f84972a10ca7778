// gpufleet-scheduler is kube-scheduler with the GPUScore plugin compiled in: the same flags and the same
// --config file, plus GPUScore and GPUClaimScore (DRA claims) as plugin names the configuration may enable.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/gpufleet/mig/k8s/plugins/gpuclaimscore"
	"github.com/gpufleet/mig/k8s/plugins/gpuscore"
)

func main() {
	command := app.NewSchedulerCommand(
		app.WithPlugin(gpuscore.Name, gpuscore.New),
		app.WithPlugin(gpuclaimscore.Name, gpuclaimscore.New),
	)
	os.Exit(cli.Run(command))
}
