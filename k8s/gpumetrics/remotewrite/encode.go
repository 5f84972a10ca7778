package remotewrite

// The sender's side of the protocol, for the tests, the benchmark and gpufleet-rw-sender: a WriteRequest as
// Prometheus encodes it (labels sorted by name), compressed as one snappy block.

import (
	"math"
	"sort"

	"github.com/klauspost/compress/snappy"
	"google.golang.org/protobuf/encoding/protowire"
)

// Label is one label of a series.
type Label struct{ Name, Value string }

// Sample is one value of a series at Timestamp (milliseconds since the epoch).
type Sample struct {
	Value     float64
	Timestamp int64
}

// TimeSeries is one series of a WriteRequest.
type TimeSeries struct {
	Labels  []Label
	Samples []Sample
}

// StaleNaN is Prometheus' stale marker, the value a sender writes when a series ends.
var StaleNaN = math.Float64frombits(staleNaN)

// AppendWriteRequest appends the WriteRequest of series to buf, each series' labels sorted by name as Prometheus
// sends them (the series' Labels are sorted in place).
func AppendWriteRequest(buf []byte, series []TimeSeries) []byte {
	var message []byte
	for i := range series {
		s := &series[i]
		sort.Slice(s.Labels, func(a, b int) bool { return s.Labels[a].Name < s.Labels[b].Name })
		message = message[:0]
		for _, label := range s.Labels {
			message = protowire.AppendTag(message, 1, protowire.BytesType)
			message = protowire.AppendVarint(message, uint64(labelSize(label)))
			message = appendString(message, 1, label.Name)
			message = appendString(message, 2, label.Value)
		}
		for _, sample := range s.Samples {
			message = protowire.AppendTag(message, 2, protowire.BytesType)
			message = protowire.AppendVarint(message, uint64(sampleSize(sample)))
			message = protowire.AppendTag(message, 1, protowire.Fixed64Type)
			message = protowire.AppendFixed64(message, math.Float64bits(sample.Value))
			if sample.Timestamp != 0 {
				message = protowire.AppendTag(message, 2, protowire.VarintType)
				message = protowire.AppendVarint(message, uint64(sample.Timestamp))
			}
		}
		buf = protowire.AppendTag(buf, 1, protowire.BytesType)
		buf = protowire.AppendBytes(buf, message)
	}
	return buf
}

// Compress is the snappy block of a WriteRequest, as the body of a request.
func Compress(dst, request []byte) []byte { return snappy.Encode(dst, request) }

func appendString(b []byte, field protowire.Number, s string) []byte {
	b = protowire.AppendTag(b, field, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func labelSize(label Label) int {
	return protowire.SizeTag(1) + protowire.SizeBytes(len(label.Name)) + protowire.SizeTag(2) + protowire.SizeBytes(len(label.Value))
}

func sampleSize(sample Sample) int {
	size := protowire.SizeTag(1) + protowire.SizeFixed64()
	if sample.Timestamp != 0 {
		size += protowire.SizeTag(2) + protowire.SizeVarint(uint64(sample.Timestamp))
	}
	return size
}
