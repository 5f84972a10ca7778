package gpuscore

import (
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// isGPUResource reports whether name is a device the plugin decides on: whole GPUs or MIG instances.
func isGPUResource(name string) bool {
	return name == WholeGPUResource || strings.HasPrefix(name, MIGResourcePrefix)
}

func containerGPUs(c *v1.Container, into map[string]int64) {
	// Requests win when both are set; a limit stands in for a missing request (pods.py's rule).
	for _, list := range []v1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
		for name, quantity := range list {
			if isGPUResource(string(name)) {
				into[string(name)] = quantity.Value()
			}
		}
	}
}

// PodGPURequest is what pod asks for, as the extender's pods.pod_gpu_request: the sum over containers or the
// largest init container, whichever is larger, sorted by resource name; empty when the pod wants no GPU.
func PodGPURequest(pod *v1.Pod) []ResourceRequest {
	total := map[string]int64{}
	for i := range pod.Spec.Containers {
		counts := map[string]int64{}
		containerGPUs(&pod.Spec.Containers[i], counts)
		for name, n := range counts {
			total[name] += n
		}
	}
	for i := range pod.Spec.InitContainers {
		counts := map[string]int64{}
		containerGPUs(&pod.Spec.InitContainers[i], counts)
		for name, n := range counts {
			total[name] = max(total[name], n)
		}
	}
	var request []ResourceRequest
	for name, n := range total {
		if n > 0 {
			request = append(request, ResourceRequest{name, int(n)})
		}
	}
	sort.Slice(request, func(i, j int) bool { return request[i].Resource < request[j].Resource })
	return request
}
