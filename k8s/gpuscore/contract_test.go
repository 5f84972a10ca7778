package gpuscore

// GPUScore's args against the settings contract (extender/src/gpufleet_extender/settings_contract.json), the one
// declaration of every decision setting that the extender reads: each arg's Go type, default, range and choices
// must be the contract's, so that a default changed on one side only fails here.

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

const contractFile = "../../extender/src/gpufleet_extender/settings_contract.json"

type contractSetting struct {
	Arg     string          `json:"arg"`
	Type    string          `json:"type"`
	Default json.RawMessage `json:"default"`
	Min     *float64        `json:"min"`
	MinOpen bool            `json:"minOpen"`
	Max     *float64        `json:"max"`
	MaxOpen bool            `json:"maxOpen"`
	Choices []string        `json:"choices"`
}

func loadContract(t *testing.T) map[string]contractSetting {
	t.Helper()
	raw, err := os.ReadFile(contractFile)
	if err != nil {
		t.Fatalf("the settings contract: %v (GPUScore is tested inside the repository)", err)
	}
	var contract struct {
		Settings map[string]contractSetting `json:"settings"`
	}
	if err := json.Unmarshal(raw, &contract); err != nil {
		t.Fatalf("%s: %v", contractFile, err)
	}
	return contract.Settings
}

// goTypes: the Go type of an Args field for each contract type.
var goTypes = map[string]reflect.Type{
	"float":    reflect.TypeOf(0.0),
	"string":   reflect.TypeOf(""),
	"path":     reflect.TypeOf(""),
	"choice":   reflect.TypeOf(""),
	"bool":     reflect.TypeOf(false),
	"strings":  reflect.TypeOf([]string{}),
	"replicas": reflect.TypeOf(map[string]int{}),
}

// contractMismatches is every way defaults (DefaultArgs) and validate (Args.problems) differ from contract.
func contractMismatches(contract map[string]contractSetting, defaults Args, validate func(Args) []string) []string {
	var mismatches []string
	fields := map[string]reflect.StructField{}
	argType := reflect.TypeOf(defaults)
	for i := range argType.NumField() {
		name, _, _ := strings.Cut(argType.Field(i).Tag.Get("json"), ",")
		fields[name] = argType.Field(i)
	}
	declared := map[string]bool{}
	for _, setting := range contract {
		declared[setting.Arg] = true
	}
	for _, name := range sortedKeys(fields) {
		if !declared[name] {
			mismatches = append(mismatches, name+": an arg the settings contract does not declare")
		}
	}
	refuses := func(args Args, arg string) bool {
		for _, problem := range validate(args) {
			if strings.HasPrefix(problem, arg+":") {
				return true
			}
		}
		return false
	}
	for _, name := range sortedKeys(contract) {
		setting := contract[name]
		field, ok := fields[setting.Arg]
		if !ok {
			mismatches = append(mismatches, fmt.Sprintf("%s: no arg %s", name, setting.Arg))
			continue
		}
		if want := goTypes[setting.Type]; want == nil || field.Type.Kind() != want.Kind() ||
			(want.Kind() != reflect.String && field.Type != want) {
			mismatches = append(mismatches, fmt.Sprintf("%s: type %s for the contract's %s", setting.Arg, field.Type, setting.Type))
			continue
		}
		value := reflect.ValueOf(defaults).FieldByIndex(field.Index)
		got, _ := json.Marshal(value.Interface())
		if !sameJSON(got, setting.Default, setting.Type) {
			mismatches = append(mismatches, fmt.Sprintf("%s: default %s, the contract's %s", setting.Arg, got, setting.Default))
		}
		with := func(v any) Args {
			args := defaults
			target := reflect.ValueOf(&args).Elem().FieldByIndex(field.Index)
			if setting.Type == "replicas" {
				target.Set(reflect.ValueOf(map[string]int{WholeGPUResource: int(v.(float64))}))
			} else {
				target.Set(reflect.ValueOf(v).Convert(field.Type))
			}
			return args
		}
		// The range: each end taken or refused as the contract says, the next number outside refused.
		step := func(x, towards float64) float64 {
			if setting.Type == "replicas" {
				return x + math.Copysign(1, towards-x)
			}
			return math.Nextafter(x, towards)
		}
		if setting.Min != nil {
			if refuses(with(*setting.Min), setting.Arg) != setting.MinOpen {
				mismatches = append(mismatches, fmt.Sprintf("%s: the low end %g is %s", setting.Arg, *setting.Min, takenOrNot(setting.MinOpen)))
			}
			if !refuses(with(step(*setting.Min, math.Inf(-1))), setting.Arg) {
				mismatches = append(mismatches, fmt.Sprintf("%s: below %g is taken", setting.Arg, *setting.Min))
			}
		} else if setting.Type == "float" && refuses(with(-1e12), setting.Arg) {
			mismatches = append(mismatches, fmt.Sprintf("%s: no low end in the contract, -1e12 refused", setting.Arg))
		}
		if setting.Max != nil {
			if refuses(with(*setting.Max), setting.Arg) != setting.MaxOpen {
				mismatches = append(mismatches, fmt.Sprintf("%s: the high end %g is %s", setting.Arg, *setting.Max, takenOrNot(setting.MaxOpen)))
			}
			if !refuses(with(step(*setting.Max, math.Inf(1))), setting.Arg) {
				mismatches = append(mismatches, fmt.Sprintf("%s: above %g is taken", setting.Arg, *setting.Max))
			}
		} else if setting.Type == "float" && refuses(with(1e12), setting.Arg) {
			mismatches = append(mismatches, fmt.Sprintf("%s: no high end in the contract, 1e12 refused", setting.Arg))
		}
		if setting.Type == "choice" {
			for _, choice := range setting.Choices {
				if refuses(with(choice), setting.Arg) {
					mismatches = append(mismatches, fmt.Sprintf("%s: the contract's choice %q is refused", setting.Arg, choice))
				}
			}
			if !refuses(with("not-a-choice"), setting.Arg) {
				mismatches = append(mismatches, fmt.Sprintf("%s: takes a value the contract does not list", setting.Arg))
			}
		}
	}
	return mismatches
}

func takenOrNot(open bool) string {
	if open {
		return "taken, the contract excludes it"
	}
	return "refused, the contract includes it"
}

// sameJSON compares a Go default with the contract's: numbers by value, a null path as Go's "" (no file).
func sameJSON(goValue, contractValue json.RawMessage, kind string) bool {
	var a, b any
	if json.Unmarshal(goValue, &a) != nil || json.Unmarshal(contractValue, &b) != nil {
		return false
	}
	if kind == "path" && b == nil {
		b = ""
	}
	return reflect.DeepEqual(a, b)
}

// The resource names the decision reads are the contract's (the extender reads them from it).
func TestResourceNamesAreTheSettingsContracts(t *testing.T) {
	raw, err := os.ReadFile(contractFile)
	if err != nil {
		t.Fatal(err)
	}
	var contract struct {
		Resources struct {
			WholeGPU  string `json:"wholeGPU"`
			MIGPrefix string `json:"migPrefix"`
		} `json:"resources"`
	}
	if err := json.Unmarshal(raw, &contract); err != nil {
		t.Fatal(err)
	}
	if contract.Resources.WholeGPU != WholeGPUResource || contract.Resources.MIGPrefix != MIGResourcePrefix {
		t.Errorf("resources %+v, GPUScore reads %q and %q", contract.Resources, WholeGPUResource, MIGResourcePrefix)
	}
}

func TestArgsAreTheSettingsContracts(t *testing.T) {
	contract := loadContract(t)
	validate := func(a Args) []string { return Problems(ValidateArgs(nil, &a)) }
	for _, mismatch := range contractMismatches(contract, DefaultArgs(), validate) {
		t.Error(mismatch)
	}
}

// The check above fails when one side changes alone: a default, a range end, a choice, an arg of its own.
func TestTheContractCheckCatchesAChangeOnOneSide(t *testing.T) {
	contract := loadContract(t)
	validate := func(a Args) []string { return Problems(ValidateArgs(nil, &a)) }
	changedDefault := maps.Clone(contract)
	entry := changedDefault["GPU_UTIL_THRESHOLD"]
	entry.Default = json.RawMessage("0.75")
	changedDefault["GPU_UTIL_THRESHOLD"] = entry
	goDefault := DefaultArgs()
	goDefault.MemUtilThreshold = 0.85
	changedRange := maps.Clone(contract)
	entry = changedRange["PACK_TARGET_UTIL"]
	entry.MaxOpen = false
	changedRange["PACK_TARGET_UTIL"] = entry
	changedChoices := maps.Clone(contract)
	entry = changedChoices["SCORING_STRATEGY"]
	entry.Choices = append(slices.Clone(entry.Choices), "balanced")
	changedChoices["SCORING_STRATEGY"] = entry
	lessArgs := maps.Clone(contract)
	delete(lessArgs, "INTERFERENCE_WEIGHT")
	for _, c := range []struct {
		name     string
		contract map[string]contractSetting
		defaults Args
		want     string
	}{
		{"the contract's default", changedDefault, DefaultArgs(), "gpuUtilThreshold: default 0.8, the contract's 0.75"},
		{"GPUScore's default", contract, goDefault, "memUtilThreshold: default 0.85, the contract's 0.9"},
		{"a range end", changedRange, DefaultArgs(), "packTargetUtil: the high end 1 is refused, the contract includes it"},
		{"a choice", changedChoices, DefaultArgs(), `scoringStrategy: the contract's choice "balanced" is refused`},
		{"an arg", lessArgs, DefaultArgs(), "interferenceWeight: an arg the settings contract does not declare"},
	} {
		got := contractMismatches(c.contract, c.defaults, validate)
		if !slices.Contains(got, c.want) || len(got) != 1 {
			t.Errorf("%s changed: got %q, want exactly %q", c.name, got, c.want)
		}
	}
}

// ValidateArgs returns every error at once, each with its field path (under a given root too), and Problems says
// them in the extender's words.
func TestValidateArgsReturnsEveryErrorWithItsFieldPath(t *testing.T) {
	args := DefaultArgs()
	args.GPUUtilThreshold = 1.5
	args.NodeNameLabels = nil
	args.SharedResources = map[string]int{WholeGPUResource: 65}
	args.WeightGPUUtil, args.WeightMemUtil = 0.5, 0.4
	args.ScoringStrategy = "balanced"
	errs := ValidateArgs(field.NewPath("pluginConfig").Index(0).Child("args"), &args)
	var paths []string
	for _, err := range errs {
		paths = append(paths, err.Type.String()+" "+err.Field)
	}
	want := []string{
		"Invalid value pluginConfig[0].args.gpuUtilThreshold",
		"Invalid value pluginConfig[0].args.sharedResources[nvidia.com/gpu]",
		"Required value pluginConfig[0].args.nodeNameLabels",
		"Invalid value pluginConfig[0].args.scoringStrategy",
		"Forbidden pluginConfig[0].args.weightMemUtil",
	}
	if !slices.Equal(paths, want) {
		t.Errorf("errors at %q, want %q", paths, want)
	}
	problems := Problems(ValidateArgs(nil, &args))
	wantProblems := []string{
		"gpuUtilThreshold: 1.5 is not in (0, 1]",
		"sharedResources: nvidia.com/gpu: 65 replicas is not in [1, 64]",
		"nodeNameLabels: needs at least one label name, e.g. Hostname,hostname",
		`scoringStrategy: must be spread, pack or auto (got "balanced")`,
		"weightGPUUtil + weightMemUtil must be 1.0 (got 0.5 + 0.4 = 0.9)",
	}
	if !slices.Equal(problems, wantProblems) {
		t.Errorf("problems %q, want %q", problems, wantProblems)
	}
	if errs := ValidateArgs(nil, new(DefaultArgs())); len(errs) != 0 {
		t.Errorf("the defaults are refused: %v", errs)
	}
}

// The push source's args: push needs a token file, the TLS pair goes together, the address must parse; each error
// at its own field's path, and the pull form's defaults need none of them.
func TestPushArgsAreValidatedWithTheirFieldPaths(t *testing.T) {
	root := field.NewPath("args")
	for _, c := range []struct {
		name   string
		change func(*Args)
		want   []string // "<type> <field>: <problem>"
	}{
		{"push without a token file", func(a *Args) { a.MetricsSource = SourcePush }, []string{
			"Forbidden args.remoteWriteTokenFile: metricsSource push needs remoteWriteTokenFile (the bearer token remote-write senders must present)"}},
		{"push with a token file", func(a *Args) { a.MetricsSource, a.RemoteWriteTokenFile = SourcePush, "/token" }, nil},
		{"an unknown source", func(a *Args) { a.MetricsSource = "pull" }, []string{
			`Invalid value args.metricsSource: must be prometheus or push (got "pull")`}},
		{"a certificate without its key", func(a *Args) { a.RemoteWriteCertFile = "/tls.crt" }, []string{
			"Forbidden args.remoteWriteKeyFile: remoteWriteCertFile and remoteWriteKeyFile go together (both for https, neither for http)"}},
		{"a key without its certificate", func(a *Args) { a.RemoteWriteKeyFile = "/tls.key" }, []string{
			"Forbidden args.remoteWriteCertFile: remoteWriteCertFile and remoteWriteKeyFile go together (both for https, neither for http)"}},
		{"both", func(a *Args) { a.RemoteWriteCertFile, a.RemoteWriteKeyFile = "/tls.crt", "/tls.key" }, nil},
		{"an address without a port", func(a *Args) { a.RemoteWriteAddress = "9402" }, []string{
			`Invalid value args.remoteWriteAddress: must be host:port or :port (got "9402")`}},
		{"a port out of range", func(a *Args) { a.RemoteWriteAddress = "127.0.0.1:70000" }, []string{
			`Invalid value args.remoteWriteAddress: port must be a number in [1, 65535] (got "70000")`}},
		{"a named port", func(a *Args) { a.RemoteWriteAddress = ":http" }, []string{
			`Invalid value args.remoteWriteAddress: port must be a number in [1, 65535] (got "http")`}},
		{"a host and a port", func(a *Args) { a.RemoteWriteAddress = "[::1]:9402" }, nil},
	} {
		args := DefaultArgs()
		c.change(&args)
		var got []string
		for _, err := range ValidateArgs(root, &args) {
			got = append(got, err.Type.String()+" "+err.Field+": "+err.Detail)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: errors %q, want %q", c.name, got, c.want)
		}
	}
}

// A removed argument is the contract's "removed" entry, and a config that still sets it gets the contract's words
// (whatever its value), not "unknown argument".
func TestRemovedArgsAreTheSettingsContracts(t *testing.T) {
	raw, err := os.ReadFile(contractFile)
	if err != nil {
		t.Fatal(err)
	}
	var contract struct {
		Removed map[string]struct {
			Arg string `json:"arg"`
			Why string `json:"why"`
		} `json:"removed"`
	}
	if err := json.Unmarshal(raw, &contract); err != nil {
		t.Fatal(err)
	}
	declared := map[string]string{}
	for _, removed := range contract.Removed {
		declared[removed.Arg] = removed.Why
	}
	if !maps.Equal(declared, removedArgs) {
		t.Fatalf("removed args %v, the contract's %v", removedArgs, declared)
	}
	for arg, why := range removedArgs {
		for _, value := range []string{`"recorded"`, `"raw"`, `1`} {
			_, problems := ParseArgs(&runtime.Unknown{Raw: []byte(`{"` + arg + `":` + value + `}`), ContentType: runtime.ContentTypeJSON})
			if want := []string{arg + ": " + why}; !slices.Equal(problems, want) {
				t.Errorf("%s: %s: problems %q, want %q", arg, value, problems, want)
			}
		}
	}
}
