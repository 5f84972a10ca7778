// Package remotewrite is GPUScore's receiver of Prometheus' remote write (protocol 1.0): the dcgm samples a
// decision needs arrive as Prometheus sends them, sample by sample into a Store kept per node and device, instead of a
// whole-fleet query every refresh. The Store is a gpumetrics Source: the Refresher publishes, ages and screens what
// it holds exactly as it does Prometheus' answers.
//
// A request is a snappy block (not the framed format) holding a prometheus.WriteRequest:
//
//	WriteRequest { repeated TimeSeries timeseries = 1; repeated MetricMetadata metadata = 3; }
//	TimeSeries   { repeated Label labels = 1; repeated Sample samples = 2; ... }
//	Label        { string name = 1; string value = 2; }
//	Sample       { double value = 1; int64 timestamp = 2; }  // milliseconds
//
// decoded here with protowire, without generated code and without an allocation per series or sample: labels are
// matched by name against the few a decision reads, and series of other metrics are skipped whole.
package remotewrite

import (
	"errors"
	"fmt"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// staleNaN is the value Prometheus writes when a series ends (a target gone, a series no longer exported).
const staleNaN = 0x7ff0000000000002

// errNoName: a series without __name__ (Prometheus never sends one; something else speaks to the receiver).
var errNoName = errors.New("a series without __name__")

// malformed is a WriteRequest that does not decode.
type malformed struct{ what string }

func (m malformed) Error() string { return "malformed protobuf: " + m.what }

// The labels a decision reads, as indexes into a parsed series' values: the fixed ones first, then the node name
// labels (args' nodeNameLabels) from labelNode on.
const (
	labelName = iota
	labelGPU
	labelUUID
	labelInstance
	labelProfile
	labelPod
	labelNamespace
	labelExportedPod
	labelExportedNamespace
	labelJob
	labelNode
	maxNodeLabels = 4
	maxLabels     = labelNode + maxNodeLabels
)

// fixedLabels are the names of the labels before labelNode, in their order. Besides __name__ and job (the scrape
// job matcher) they are gpuscore.DecisionLabels; receiver_test holds the two lists together.
var fixedLabels = [labelNode]string{"__name__", "gpu", "UUID", "GPU_I_ID", "GPU_I_PROFILE", "pod", "namespace",
	"exported_pod", "exported_namespace", "job"}

// span is a part of the decoded request.
type span struct{ start, end int32 }

// series is one kept TimeSeries of a request: its labels' values (an empty span: absent) and where its samples
// are, read again once the request decoded entirely.
type series struct {
	values  [maxLabels]span
	metric  int  // index into the metrics the decision reads
	samples span // from the first Sample field to the end of the last (other fields between are skipped)
}

// filter is what decides which series are kept: the metrics' names, the node name labels, and the exporter's
// job and namespace when args pin them ("" for any).
type filter struct {
	metrics    []string
	nodeLabels []string
	job        string
	namespace  string
}

// decoded is one request's kept series; its slices are reused from request to request.
type decoded struct {
	body    []byte
	kept    []series
	ignored int // series dropped: another metric, another job or namespace, no node name
}

func (d *decoded) value(s *series, label int) []byte {
	v := s.values[label]
	return d.body[v.start:v.end]
}

// node is the series' node name: the first node name label that is set (nil: none).
func (d *decoded) node(s *series, nodeLabels int) []byte {
	for i := range nodeLabels {
		if v := d.value(s, labelNode+i); len(v) > 0 {
			return v
		}
	}
	return nil
}

// decode parses body (a decoded snappy block) into d. Every series must be well formed and named, or the whole
// request is refused: nothing of a request is applied unless all of it decoded.
func (d *decoded) decode(body []byte, f *filter) error {
	d.body, d.kept, d.ignored = body, d.kept[:0], 0
	b := body
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return malformed{"WriteRequest: " + protowire.ParseError(n).Error()}
		}
		b = b[n:]
		if num == 1 {
			if typ != protowire.BytesType {
				return malformed{"WriteRequest.timeseries is not a message"}
			}
			message, n := consumeBytes(b)
			if n < 0 {
				return malformed{"WriteRequest.timeseries: " + protowire.ParseError(n).Error()}
			}
			start := int32(len(body) - len(b) + n - len(message))
			if err := d.series(message, start, f); err != nil {
				return err
			}
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b) // metadata, and whatever a newer sender adds
		if n < 0 {
			return malformed{fmt.Sprintf("WriteRequest field %d: %v", num, protowire.ParseError(n))}
		}
		b = b[n:]
	}
	return nil
}

// series parses one TimeSeries (message, at offset start of the body): its labels and samples, then whether it is
// kept.
func (d *decoded) series(message []byte, start int32, f *filter) error {
	var s series
	named := false
	b := message
	for len(b) > 0 {
		field := start + int32(len(message)-len(b))
		num, typ, n := consumeTag(b)
		if n < 0 {
			return malformed{"TimeSeries: " + protowire.ParseError(n).Error()}
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			label, n := consumeBytes(b)
			if n < 0 {
				return malformed{"TimeSeries.labels: " + protowire.ParseError(n).Error()}
			}
			offset := start + int32(len(message)-len(b)+n-len(label))
			name, value, err := parseLabel(label, offset)
			if err != nil {
				return err
			}
			if i := labelIndex(d.body[name.start:name.end], f.nodeLabels); i >= 0 {
				s.values[i] = value
				if i == labelName {
					named = value.end > value.start
				}
			}
			b = b[n:]
		case num == 2 && typ == protowire.BytesType:
			sample, n := consumeBytes(b)
			if n < 0 {
				return malformed{"TimeSeries.samples: " + protowire.ParseError(n).Error()}
			}
			if _, _, err := parseSample(sample); err != nil {
				return err
			}
			if s.samples.end == 0 {
				s.samples.start = field
			}
			b = b[n:]
			s.samples.end = start + int32(len(message)-len(b))
		case num == 1 || num == 2:
			return malformed{fmt.Sprintf("TimeSeries field %d has wire type %d", num, typ)}
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return malformed{fmt.Sprintf("TimeSeries field %d: %v", num, protowire.ParseError(n))}
			}
			b = b[n:]
		}
	}
	if !named {
		return errNoName
	}
	s.metric = -1
	name := d.body[s.values[labelName].start:s.values[labelName].end]
	for i, metric := range f.metrics {
		if string(name) == metric {
			s.metric = i
			break
		}
	}
	if s.metric < 0 || (f.job != "" && string(d.value(&s, labelJob)) != f.job) ||
		(f.namespace != "" && string(d.value(&s, labelNamespace)) != f.namespace) ||
		d.node(&s, len(f.nodeLabels)) == nil {
		d.ignored++
		return nil
	}
	d.kept = append(d.kept, s)
	return nil
}

// labelIndex is the index a label name is kept at (-1: not kept).
func labelIndex(text []byte, nodeLabels []string) int {
	switch string(text) {
	case "__name__":
		return labelName
	case "gpu":
		return labelGPU
	case "UUID":
		return labelUUID
	case "GPU_I_ID":
		return labelInstance
	case "GPU_I_PROFILE":
		return labelProfile
	case "pod":
		return labelPod
	case "namespace":
		return labelNamespace
	case "exported_pod":
		return labelExportedPod
	case "exported_namespace":
		return labelExportedNamespace
	case "job":
		return labelJob
	}
	for i, label := range nodeLabels {
		if string(text) == label {
			return labelNode + i
		}
	}
	return -1
}

// parseLabel is a Label's name and value, as spans of the body (label starts at offset).
func parseLabel(label []byte, offset int32) (name, value span, err error) {
	// As Prometheus writes it: the name, then the value, both under 128 bytes.
	if len(label) >= 4 && label[0] == 0x0a && label[1] < 0x80 {
		nameEnd := 2 + int(label[1])
		if nameEnd+2 <= len(label) && label[nameEnd] == 0x12 && nameEnd+2+int(label[nameEnd+1]) == len(label) && label[nameEnd+1] < 0x80 {
			return span{offset + 2, offset + int32(nameEnd)}, span{offset + int32(nameEnd) + 2, offset + int32(len(label))}, nil
		}
	}
	b := label
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return name, value, malformed{"Label: " + protowire.ParseError(n).Error()}
		}
		b = b[n:]
		if (num == 1 || num == 2) && typ == protowire.BytesType {
			v, n := consumeBytes(b)
			if n < 0 {
				return name, value, malformed{"Label: " + protowire.ParseError(n).Error()}
			}
			at := offset + int32(len(label)-len(b)+n-len(v))
			if num == 1 {
				name = span{at, at + int32(len(v))}
			} else {
				value = span{at, at + int32(len(v))}
			}
			b = b[n:]
			continue
		}
		if num == 1 || num == 2 {
			return name, value, malformed{fmt.Sprintf("Label field %d has wire type %d", num, typ)}
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return name, value, malformed{"Label: " + protowire.ParseError(n).Error()}
		}
		b = b[n:]
	}
	return name, value, nil
}

// eachSample calls fn with each Sample of b (a TimeSeries' fields, decoded once already: series.samples), in the
// order sent.
func eachSample(b []byte, fn func(value float64, timestamp int64)) error {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return malformed{"TimeSeries: " + protowire.ParseError(n).Error()}
		}
		b = b[n:]
		if num != 2 {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return malformed{"TimeSeries: " + protowire.ParseError(n).Error()}
			}
			b = b[n:]
			continue
		}
		sample, n := consumeBytes(b)
		if n < 0 {
			return malformed{"TimeSeries.samples: " + protowire.ParseError(n).Error()}
		}
		b = b[n:]
		value, timestamp, err := parseSample(sample)
		if err != nil {
			return err
		}
		fn(value, timestamp)
	}
	return nil
}

// parseSample is a Sample's value and timestamp (0 where the sender left them out, as protobuf's defaults).
func parseSample(sample []byte) (value float64, timestamp int64, err error) {
	for len(sample) > 0 {
		num, typ, n := consumeTag(sample)
		if n < 0 {
			return 0, 0, malformed{"Sample: " + protowire.ParseError(n).Error()}
		}
		sample = sample[n:]
		switch {
		case num == 1 && typ == protowire.Fixed64Type:
			bits, n := protowire.ConsumeFixed64(sample)
			if n < 0 {
				return 0, 0, malformed{"Sample.value: " + protowire.ParseError(n).Error()}
			}
			value, sample = math.Float64frombits(bits), sample[n:]
		case num == 2 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(sample)
			if n < 0 {
				return 0, 0, malformed{"Sample.timestamp: " + protowire.ParseError(n).Error()}
			}
			timestamp, sample = int64(v), sample[n:]
		case num == 1 || num == 2:
			return 0, 0, malformed{fmt.Sprintf("Sample field %d has wire type %d", num, typ)}
		default:
			if n = protowire.ConsumeFieldValue(num, typ, sample); n < 0 {
				return 0, 0, malformed{"Sample: " + protowire.ParseError(n).Error()}
			}
			sample = sample[n:]
		}
	}
	return value, timestamp, nil
}

// consumeTag is protowire.ConsumeTag, a one-byte tag (every field here) decoded inline.
func consumeTag(b []byte) (protowire.Number, protowire.Type, int) {
	if len(b) > 0 && b[0] < 0x80 && b[0] >= 8 {
		return protowire.Number(b[0] >> 3), protowire.Type(b[0] & 7), 1
	}
	return protowire.ConsumeTag(b)
}

// consumeBytes is protowire.ConsumeBytes, a length under 128 (labels, samples) decoded inline.
func consumeBytes(b []byte) ([]byte, int) {
	if len(b) > 0 && b[0] < 0x80 && int(b[0]) < len(b) {
		n := int(b[0])
		return b[1 : 1+n : 1+n], 1 + n
	}
	return protowire.ConsumeBytes(b)
}
