package gpuscore

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// ParseArgs decodes and validates the plugin's args (nil: all defaults) and returns every problem, in the words
// of the extender's check (gpufleet-extender check-config --plugin-args, which the kube_scheduler role runs before
// deploying): an unknown name or a JSON value of the wrong type is one problem each (that argument keeps its
// default), then every error of ValidateArgs.
func ParseArgs(obj runtime.Object) (Args, []string) {
	args, problems := readArgs(obj)
	return args, append(problems, Problems(ValidateArgs(nil, &args))...)
}

func readArgs(obj runtime.Object) (Args, []string) {
	args := DefaultArgs()
	if obj == nil {
		return args, nil
	}
	unknown, ok := obj.(*runtime.Unknown)
	if !ok {
		return args, []string{fmt.Sprintf("want args of type runtime.Unknown, got %T", obj)}
	}
	raw := unknown.Raw
	if len(raw) == 0 {
		return args, nil
	}
	if unknown.ContentType == runtime.ContentTypeYAML {
		converted, err := yaml.YAMLToJSON(raw)
		if err != nil {
			return args, []string{err.Error()}
		}
		raw = converted
	}
	return args, decodeStrict(raw, &args)
}

// removedArgs are arguments the plugin took once, each with what replaced it (the settings contract's "removed"):
// a config that still sets one gets that line, not "unknown argument".
var removedArgs = map[string]string{
	"prometheusQuery": "removed with the recorded form: the dcgm series are read raw from Prometheus, or pushed by its remote write (metricsSource push); delete it",
}

// argKinds: the JSON values that tell which type an argument decodes from, and how a problem says that type
// (plugin_args.py's words). The first sample an argument takes is its type.
var argKinds = []struct{ sample, words string }{
	{`0`, "a number"},
	{`""`, "a string"},
	{`false`, "true or false"},
	{`[]`, "a list of strings"},
	{`{}`, "a mapping of resource name to whole replicas"},
}

// decodeArg decodes one argument into a copy of args, as encoding/json decodes a struct by its json tags; an
// unknown name is an error (decodeStrict checks the exact name first). The list and the mapping are decoded into fresh storage, never into the defaults'.
func decodeArg(args Args, name string, value json.RawMessage) (Args, error) {
	candidate := args
	candidate.NodeNameLabels, candidate.SharedResources = nil, nil
	key, _ := json.Marshal(name)
	decoder := json.NewDecoder(bytes.NewReader([]byte("{" + string(key) + ":" + string(value) + "}")))
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(&candidate); err != nil {
		return args, err
	}
	if name != "nodeNameLabels" {
		candidate.NodeNameLabels = args.NodeNameLabels
	}
	if name != "sharedResources" {
		candidate.SharedResources = args.SharedResources
	}
	return candidate, nil
}

// decodeStrict decodes each argument on its own, so that every unknown name and every mistyped value is reported
// (encoding/json stops at the first). A JSON null is what encoding/json makes of it: an empty list or mapping, the
// default for the others.
func decodeStrict(raw []byte, into *Args) []string {
	var fields map[string]json.RawMessage
	decoder := json.NewDecoder(bytes.NewReader(raw))
	if err := decoder.Decode(&fields); err != nil {
		var syntax *json.SyntaxError
		if errors.As(err, &syntax) {
			return []string{err.Error()}
		}
		return []string{"args must be a mapping of argument name to value"}
	}
	if decoder.More() {
		return []string{"unexpected data after the args object"}
	}
	var known map[string]json.RawMessage // the arguments' names, exactly (encoding/json matches any case)
	encoded, _ := json.Marshal(DefaultArgs())
	_ = json.Unmarshal(encoded, &known)
	var problems []string
	for _, name := range sortedKeys(fields) {
		if why, ok := removedArgs[name]; ok {
			problems = append(problems, name+": "+why)
			continue
		}
		if _, ok := known[name]; !ok {
			problems = append(problems, name+": unknown argument")
			continue
		}
		decoded, err := decodeArg(*into, name, fields[name])
		if err == nil {
			*into = decoded
			continue
		}
		for _, kind := range argKinds {
			if _, wrong := decodeArg(*into, name, json.RawMessage(kind.sample)); wrong == nil {
				problems = append(problems, fmt.Sprintf("%s: must be %s", name, kind.words))
				break
			}
		}
	}
	return problems
}

func joined(problems []string) error {
	if len(problems) == 0 {
		return nil
	}
	return errors.New(strings.Join(problems, "; "))
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for key := range m {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	return keys
}
