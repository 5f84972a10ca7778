package gpuscore

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
)

// Names are matched exactly (encoding/json alone would take any case), and a value that fails to decode leaves the
// default whole: the list and the mapping are decoded into fresh storage.
func TestArgsDecodeByExactNameAndKeepDefaultsOnAWrongValue(t *testing.T) {
	raw := `{"GPUUtilThreshold": 0.5, "nodeNameLabels": ["node", 1], "sharedResources": {"nvidia.com/gpu": "2"},
		"tenantPools": "yes", "memUtilThreshold": null, "weightGPUUtil": 0.6, "weightMemUtil": 0.4}`
	args, problems := readArgs(&runtime.Unknown{Raw: []byte(raw), ContentType: runtime.ContentTypeJSON})
	want := []string{
		"GPUUtilThreshold: unknown argument",
		"nodeNameLabels: must be a list of strings",
		"sharedResources: must be a mapping of resource name to whole replicas",
		"tenantPools: must be true or false",
	}
	if !slices.Equal(problems, want) {
		t.Errorf("problems %q, want %q", problems, want)
	}
	defaults := DefaultArgs()
	if !slices.Equal(args.NodeNameLabels, defaults.NodeNameLabels) || len(args.SharedResources) != 0 {
		t.Errorf("a wrong value changed a default: %v, %v", args.NodeNameLabels, args.SharedResources)
	}
	if args.GPUUtilThreshold != defaults.GPUUtilThreshold || args.MemUtilThreshold != defaults.MemUtilThreshold ||
		!args.TenantPools || args.WeightGPUUtil != 0.6 || args.WeightMemUtil != 0.4 {
		t.Errorf("args %+v", args)
	}
}
