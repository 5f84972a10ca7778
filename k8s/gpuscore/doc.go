// Package gpuscore is the decision GPUScore and GPUClaimScore make, ported from the extender's scoring.py (the
// specification; testdata/vectors.json, generated from it, is checked by this package's tests): Evaluate and the
// claim load verdict, the args both plugins take (types, defaults and validation, held to the settings contract),
// and the snapshot a Prometheus answer describes. Pure: no I/O and no process-wide state. The plugins are
// k8s/plugins/gpuscore and k8s/plugins/gpuclaimscore; asking Prometheus is k8s/gpumetrics'.
package gpuscore
