package remotewrite

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpufleet/mig/k8s/gpuscore"

	"k8s.io/component-base/metrics/testutil"
)

const testToken = "s3cret-token"

var nodeLabels = []string{"Hostname", "hostname"}

// deviceSeries are the series dcgm-exporter gives one MIG instance (GR_ENGINE_ACTIVE, FB_USED, FB_FREE) with its
// full label set, as Prometheus' scrape labels them, at ms.
func deviceSeries(node string, gpu, instance int, util, usedMiB, freeMiB float64, ms int64) []TimeSeries {
	labels := func(metric string) []Label {
		return []Label{
			{"__name__", metric}, {"Hostname", node}, {"gpu", fmt.Sprint(gpu)}, {"UUID", fmt.Sprintf("GPU-%s-%d", node, gpu)},
			{"device", fmt.Sprintf("nvidia%d", gpu)}, {"modelName", "NVIDIA H100 80GB HBM3"},
			{"GPU_I_PROFILE", "2g.20gb"}, {"GPU_I_ID", fmt.Sprint(instance)}, {"DCGM_FI_DRIVER_VERSION", "550.54.15"},
			{"job", "dcgm-exporter"}, {"namespace", "gpufleet-node-agents"}, {"instance", "10.0.0.1:9400"},
			{"pod", "dcgm-exporter-abcde"}, {"container", "dcgm-exporter"},
		}
	}
	return []TimeSeries{
		{labels("DCGM_FI_PROF_GR_ENGINE_ACTIVE"), []Sample{{util, ms}}},
		{labels("DCGM_FI_DEV_FB_USED"), []Sample{{usedMiB, ms}}},
		{labels("DCGM_FI_DEV_FB_FREE"), []Sample{{freeMiB, ms}}},
		{labels("DCGM_FI_DEV_POWER_USAGE"), []Sample{{300, ms}}}, // a series the decision does not read
	}
}

func body(series ...[]TimeSeries) []byte {
	return Compress(nil, AppendWriteRequest(nil, slices.Concat(series...)))
}

type harness struct {
	t      *testing.T
	url    string
	store  *Store
	token  string // the token file
	now    float64
	source *Source
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, store: NewStore(nodeLabels, "dcgm-exporter", "gpufleet-node-agents", 5), token: token, now: 1_700_000_100}
	h.store.now = func() float64 { return h.now }
	h.source = h.store.NewSource()
	server := httptest.NewServer(http.HandlerFunc(NewReceiver(h.store, token).ServeHTTP))
	t.Cleanup(server.Close)
	h.url = server.URL + Path
	return h
}

func (h *harness) post(body []byte, headers map[string]string) int {
	h.t.Helper()
	request, err := http.NewRequest(http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	request.Header.Set("Authorization", "Bearer "+testToken)
	request.Header.Set("Content-Type", "application/x-protobuf")
	request.Header.Set("Content-Encoding", "snappy")
	request.Header.Set("X-Prometheus-Remote-Write-Version", "0.1.0")
	for name, value := range headers {
		if value == "" {
			request.Header.Del(name)
		} else {
			request.Header.Set(name, value)
		}
	}
	response, err := http.DefaultClient.Do(request)
	if err != nil {
		h.t.Fatal(err)
	}
	response.Body.Close()
	return response.StatusCode
}

// snapshot is what a new reader of the store would publish now.
func (h *harness) snapshot() *gpuscore.Snapshot {
	h.t.Helper()
	s, err := h.store.NewSource().Fetch(context.Background(), 1)
	if err != nil || s == nil {
		h.t.Fatalf("a new source's first Fetch: %v, %v", s, err)
	}
	return s
}

func counter(t *testing.T, c interface{ Inc() }) float64 {
	t.Helper()
	m, ok := c.(interface {
		Inc()
		Add(float64)
	})
	if !ok {
		t.Fatalf("%T is no counter", c)
	}
	v, err := testutil.GetCounterMetricValue(m)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func refusedCount(t *testing.T, reason string) float64 {
	return counter(t, refused.WithLabelValues(reason))
}

const t0 = int64(1_700_000_000_000) // ms

// A valid write lands in the snapshot, as the pull form would fold the same series: the same screening and fold.
func TestAValidWriteLandsInTheSnapshotAsThePullFormWouldFoldIt(t *testing.T) {
	h := newHarness(t)
	accepted := counter(t, samplesAccepted)
	ignored := counter(t, seriesIgnored)
	write := [][]TimeSeries{
		deviceSeries("node-a", 0, 1, 0.25, 5000, 15000, t0),
		deviceSeries("node-a", 0, 2, 0.75, 10000, 10000, t0+1000),
		deviceSeries("node-b", 3, 1, 0.5, 0, 20000, t0+2000),
	}
	for i := range write[1] { // a tenant's pod on instance 2: the exporter's pod mapping, renamed by the scrape
		write[1][i].Labels = append(write[1][i].Labels, Label{"exported_pod", "job-1"}, Label{"exported_namespace", "tenant-a"})
	}
	if status := h.post(body(write...), nil); status != http.StatusNoContent {
		t.Fatalf("status %d, want 204", status)
	}
	if got := counter(t, samplesAccepted) - accepted; got != 9 {
		t.Errorf("%g samples accepted, want 9", got)
	}
	if got := counter(t, seriesIgnored) - ignored; got != 3 {
		t.Errorf("%g series ignored, want 3 (the power series)", got)
	}
	pushed, err := h.source.Fetch(context.Background(), 7)
	if err != nil || pushed == nil {
		t.Fatalf("Fetch: %v, %v", pushed, err)
	}
	if pushed.Version != 7 || !slices.Equal(pushed.Order, []string{"node-a", "node-b"}) {
		t.Fatalf("version %d, nodes %v", pushed.Version, pushed.Order)
	}
	devices := pushed.Nodes["node-a"].Devices["nvidia.com/mig-2g.20gb"]
	if len(devices) != 2 || devices[0].Key != "0/1" || devices[0].Util != 0.25 || devices[0].Mem != 0.25 ||
		devices[1].Util != 0.75 || devices[1].Mem != 0.5 || pushed.Nodes["node-a"].SampleTime != float64(t0+1000)/1000 {
		t.Errorf("node-a: %+v at %v", devices, pushed.Nodes["node-a"].SampleTime)
	}
	// The pull form, from the same series as Prometheus' answer would give them.
	var series, times []gpuscore.Series
	for _, s := range slices.Concat(write...) {
		metric := map[string]string{}
		for _, l := range s.Labels {
			metric[l.Name] = l.Value
		}
		value := func(v float64) []byte { return fmt.Appendf(nil, `"%v"`, v) }
		series = append(series, gpuscore.Series{Metric: metric, Value: []json.RawMessage{[]byte("0"), value(s.Samples[0].Value)}})
		if metric["__name__"] == "DCGM_FI_DEV_FB_FREE" {
			times = append(times, gpuscore.Series{Metric: map[string]string{"Hostname": metric["Hostname"]},
				Value: []json.RawMessage{[]byte("0"), value(float64(s.Samples[0].Timestamp) / 1000)}})
		}
	}
	pulled := gpuscore.SnapshotFromSeries(series, times, nodeLabels, h.now, h.now, 5, 7)
	if !reflect.DeepEqual(pushed, pulled) {
		t.Errorf("pushed %+v, the pull form %+v", pushed.Nodes["node-a"], pulled.Nodes["node-a"])
	}
	if again, _ := h.source.Fetch(context.Background(), 8); again != nil {
		t.Errorf("nothing arrived, yet Fetch built snapshot %d", again.Version)
	}
}

// Every refusal: its status, its counter, and the snapshot unharmed (a request is applied whole or not at all).
func TestRefusalsLeaveTheSnapshotUnharmed(t *testing.T) {
	h := newHarness(t)
	if status := h.post(body(deviceSeries("node-a", 0, 1, 0.25, 5000, 15000, t0)), nil); status != http.StatusNoContent {
		t.Fatalf("status %d", status)
	}
	if s, _ := h.source.Fetch(context.Background(), 1); s == nil {
		t.Fatal("no snapshot")
	}
	before := h.snapshot()
	later := deviceSeries("node-a", 0, 1, 0.99, 19000, 1000, t0+15000)
	valid := AppendWriteRequest(nil, later)
	noName := AppendWriteRequest(nil, []TimeSeries{{[]Label{{"Hostname", "node-a"}}, []Sample{{1, t0 + 15000}}}})
	truncated := append(slices.Clone(valid), 0x0a, 0x7f, 0x0a)             // a series announced 127 bytes long, 1 there
	wrongType := append(slices.Clone(valid), 0x09, 1, 2, 3, 4, 5, 6, 7, 8) // timeseries as a fixed64
	oversized := append(binaryUvarint(MaxDecodedBytes+1), 0x00)            // a snappy header announcing 8 MiB + 1
	huge := make([]byte, maxBodyBytes+1)
	protobuf := map[string]string{"Content-Type": "application/x-protobuf"}
	for _, c := range []struct {
		name    string
		body    []byte
		headers map[string]string
		method  string
		status  int
		reason  string
	}{
		{"no token", Compress(nil, valid), map[string]string{"Authorization": ""}, "", 401, reasonUnauthorized},
		{"a wrong token", Compress(nil, valid), map[string]string{"Authorization": "Bearer " + testToken + "x"}, "", 401, reasonUnauthorized},
		{"basic auth", Compress(nil, valid), map[string]string{"Authorization": "Basic " + testToken}, "", 401, reasonUnauthorized},
		{"JSON", Compress(nil, valid), map[string]string{"Content-Type": "application/json"}, "", 415, reasonContentType},
		{"remote write 2.0", Compress(nil, valid), map[string]string{"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request"}, "", 415, reasonContentType},
		{"gzip", Compress(nil, valid), map[string]string{"Content-Encoding": "gzip"}, "", 415, reasonContentEncoding},
		{"uncompressed", valid, map[string]string{"Content-Encoding": ""}, "", 415, reasonContentEncoding},
		{"malformed snappy", []byte("this is not snappy at all"), protobuf, "", 400, reasonSnappy},
		{"snappy shorter than announced", Compress(nil, valid)[:20], nil, "", 400, reasonSnappy},
		{"truncated protobuf", Compress(nil, truncated), nil, "", 400, reasonProtobuf},
		{"a wire type", Compress(nil, wrongType), nil, "", 400, reasonProtobuf},
		{"no __name__", Compress(nil, slices.Concat(valid, noName)), nil, "", 400, reasonNoName},
		{"too large by the snappy header", oversized, nil, "", 413, reasonTooLarge},
		{"too large a body", huge, nil, "", 413, reasonTooLarge},
		{"GET", nil, nil, http.MethodGet, 405, reasonMethod},
	} {
		count := refusedCount(t, c.reason)
		var status int
		if c.method != "" {
			response, err := http.Get(h.url)
			if err != nil {
				t.Fatal(err)
			}
			response.Body.Close()
			status = response.StatusCode
		} else {
			status = h.post(c.body, c.headers)
		}
		if status != c.status {
			t.Errorf("%s: status %d, want %d", c.name, status, c.status)
		}
		if got := refusedCount(t, c.reason) - count; got != 1 {
			t.Errorf("%s: refused_total{reason=%q} moved by %g, want 1", c.name, c.reason, got)
		}
		if s, _ := h.source.Fetch(context.Background(), 2); s != nil {
			t.Errorf("%s: the source built a new snapshot after a refusal", c.name)
		}
		if after := h.snapshot(); !reflect.DeepEqual(before, after) {
			t.Errorf("%s: the snapshot changed: %+v", c.name, after.Nodes["node-a"])
		}
	}
	// The same write, whole and authenticated, is taken.
	if status := h.post(Compress(nil, valid), nil); status != http.StatusNoContent {
		t.Errorf("the valid write: status %d", status)
	}
	if util := h.snapshot().Nodes["node-a"].Devices["nvidia.com/mig-2g.20gb"][0].Util; util != 0.99 {
		t.Errorf("util %g after the valid write, want 0.99", util)
	}
}

func binaryUvarint(v uint64) []byte {
	var b []byte
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// Out of order: an older sample than the one held is ignored and counted. A stale marker removes its series, and a
// node without any series leaves the snapshot.
func TestOutOfOrderSamplesAreIgnoredAndStaleMarkersRemoveSeries(t *testing.T) {
	h := newHarness(t)
	h.post(body(deviceSeries("node-a", 0, 1, 0.5, 5000, 15000, t0+15000), deviceSeries("node-a", 1, 1, 0.1, 0, 20000, t0+15000)), nil)
	before := h.snapshot()
	outOfOrder := counter(t, samplesOutOfOrder)
	if status := h.post(body(deviceSeries("node-a", 0, 1, 0.9, 19000, 1000, t0)), nil); status != http.StatusNoContent {
		t.Errorf("out of order: status %d, want 204 (Prometheus would retry anything else)", status)
	}
	if got := counter(t, samplesOutOfOrder) - outOfOrder; got != 3 {
		t.Errorf("%g samples out of order counted, want 3", got)
	}
	if after := h.snapshot(); !reflect.DeepEqual(before, after) {
		t.Errorf("an older sample changed the snapshot: %+v", after.Nodes["node-a"])
	}
	stale := deviceSeries("node-a", 0, 1, StaleNaN, StaleNaN, StaleNaN, t0+30000)
	h.post(body(stale), nil)
	devices := h.snapshot().Nodes["node-a"].Devices["nvidia.com/mig-2g.20gb"]
	if len(devices) != 1 || devices[0].Key != "1/1" {
		t.Errorf("after gpu 0's stale markers: %+v, want gpu 1's instance alone", devices)
	}
	h.post(body(deviceSeries("node-a", 1, 1, StaleNaN, StaleNaN, StaleNaN, t0+30000)), nil)
	if nodes := h.snapshot().Nodes; len(nodes) != 0 {
		t.Errorf("every series of node-a stale, yet the snapshot has %v", nodes)
	}
}

// The pull form's screening holds for pushed samples: a value out of range leaves the node out, so does a sample
// dated beyond the clock skew until the clock reaches it; a node silent for the lookback leaves.
func TestScreeningFutureSamplesAndExpiry(t *testing.T) {
	h := newHarness(t)
	h.post(body(deviceSeries("node-a", 0, 1, 1.5, 5000, 15000, t0), deviceSeries("node-b", 0, 1, 0.5, 5000, 15000, t0)), nil)
	if nodes := h.snapshot().Order; !slices.Equal(nodes, []string{"node-b"}) {
		t.Errorf("GR_ENGINE_ACTIVE 1.5 on node-a: nodes %v, want node-b alone", nodes)
	}
	future := int64(h.now*1000) + 60_000
	h.post(body(deviceSeries("node-c", 0, 1, 0.5, 5000, 15000, future)), nil)
	if s, _ := h.source.Fetch(context.Background(), 1); s == nil || s.Nodes["node-c"] != nil {
		t.Errorf("a node dated 60 s ahead is in the snapshot")
	}
	h.now += 60
	if s, _ := h.source.Fetch(context.Background(), 2); s == nil || s.Nodes["node-c"] == nil {
		t.Errorf("once the clock reached it, node-c is still left out")
	}
	h.now = float64(future)/1000 + seriesExpiry.Seconds() - 1
	if s, _ := h.source.Fetch(context.Background(), 3); s == nil || !slices.Equal(s.Order, []string{"node-c"}) {
		t.Errorf("after the others' lookback: %v, want node-c alone", s)
	}
}

// The token file is read again when it changes: the old token is refused from then on, the new one taken.
func TestTheTokenFileIsReadAgainWhenItChanges(t *testing.T) {
	h := newHarness(t)
	write := body(deviceSeries("node-a", 0, 1, 0.5, 5000, 15000, t0))
	if status := h.post(write, nil); status != http.StatusNoContent {
		t.Fatalf("status %d", status)
	}
	if err := os.WriteFile(h.token, []byte("rotated-token-value\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Minute)
	_ = os.Chtimes(h.token, future, future)
	if status := h.post(write, nil); status != http.StatusUnauthorized {
		t.Errorf("the old token after the rotation: status %d, want 401", status)
	}
	if status := h.post(write, map[string]string{"Authorization": "Bearer rotated-token-value"}); status != http.StatusNoContent {
		t.Errorf("the new token: status %d, want 204", status)
	}
	if err := os.Remove(h.token); err != nil {
		t.Fatal(err)
	}
	count := refusedCount(t, reasonTokenFile)
	if status := h.post(write, map[string]string{"Authorization": "Bearer rotated-token-value"}); status != http.StatusUnauthorized {
		t.Errorf("without a token file: status %d, want 401", status)
	}
	if refusedCount(t, reasonTokenFile)-count != 1 {
		t.Errorf("the missing token file is not counted")
	}
}

// The receiver keeps the labels a decision reads: gpuscore's, besides __name__ and job.
func TestTheKeptLabelsAreTheDecisionsLabels(t *testing.T) {
	want := append([]string{"__name__"}, gpuscore.DecisionLabels()...)
	got := slices.DeleteFunc(slices.Clone(fixedLabels[:]), func(l string) bool { return l == "job" })
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("kept %v, a decision reads %v", got, want)
	}
	for i, name := range fixedLabels {
		if labelIndex([]byte(name), nil) != i {
			t.Errorf("%s is not kept at %d", name, i)
		}
	}
}

// The decoder never panics and keeps nothing outside the body, whatever it is given.
func FuzzDecode(f *testing.F) {
	f.Add(AppendWriteRequest(nil, deviceSeries("node-a", 0, 1, 0.5, 5000, 15000, t0)))
	f.Add(AppendWriteRequest(nil, []TimeSeries{{[]Label{{"Hostname", "x"}}, nil}}))
	f.Add([]byte{0x0a, 0x7f, 0x0a})
	f.Add([]byte{0x1a, 0x02, 0x08, 0x01, 0x0a, 0x00})
	f.Add([]byte{})
	filter := &filter{metrics: gpuscore.DCGMMetrics(), nodeLabels: nodeLabels}
	f.Fuzz(func(t *testing.T, data []byte) {
		var d decoded
		if err := d.decode(data, filter); err != nil {
			return
		}
		for i := range d.kept {
			s := &d.kept[i]
			for _, v := range s.values {
				if v.start < 0 || v.end < v.start || int(v.end) > len(data) {
					t.Fatalf("span %v outside %d bytes", v, len(data))
				}
			}
			if err := eachSample(data[s.samples.start:s.samples.end], func(float64, int64) {}); err != nil {
				t.Fatalf("a kept series' samples do not decode: %v", err)
			}
		}
		store := NewStore(nodeLabels, "", "", 5)
		store.apply(&d)
	})
}

// Serve over https with the PEM pair: a sender trusting the certificate writes; plain http there gets no 204; the
// server stops with its ctx.
func TestServeOverTLSAndStopWithTheContext(t *testing.T) {
	dir := t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "receiver"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, tokenFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "token")
	for file, text := range map[string][]byte{
		certFile:  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyFile:   pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		tokenFile: []byte(testToken),
	} {
		if err := os.WriteFile(file, text, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	store := NewStore(nodeLabels, "", "", 5)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	address, err := NewReceiver(store, tokenFile).Serve(ctx, "127.0.0.1:0", certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	post := func(client *http.Client, scheme string) (int, error) {
		request, _ := http.NewRequest(http.MethodPost, scheme+"://"+address.String()+Path,
			bytes.NewReader(body(deviceSeries("node-a", 0, 1, 0.5, 5000, 15000, t0))))
		request.Header.Set("Authorization", "Bearer "+testToken)
		request.Header.Set("Content-Type", "application/x-protobuf")
		request.Header.Set("Content-Encoding", "snappy")
		response, err := client.Do(request)
		if err != nil {
			return 0, err
		}
		response.Body.Close()
		return response.StatusCode, nil
	}
	if status, err := post(client, "https"); err != nil || status != http.StatusNoContent {
		t.Fatalf("over https: %d, %v", status, err)
	}
	if status, err := post(http.DefaultClient, "http"); err == nil && status == http.StatusNoContent {
		t.Error("plain http was taken by the https receiver")
	}
	if _, err := NewReceiver(store, tokenFile).Serve(ctx, "127.0.0.1:0", certFile, filepath.Join(dir, "missing.key")); err == nil {
		t.Error("a receiver started without its key")
	}
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := post(&http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}, "https"); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the receiver still answers 5 s after its ctx ended")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A body sent without a length (chunked) is bounded as it is read: past the largest snappy block it is refused.
func TestAChunkedBodyIsBoundedAsItIsRead(t *testing.T) {
	h := newHarness(t)
	h.post(body(deviceSeries("node-a", 0, 1, 0.5, 5000, 15000, t0)), nil)
	before := h.snapshot()
	count := refusedCount(t, reasonTooLarge)
	request, err := http.NewRequest(http.MethodPost, h.url, io.MultiReader(bytes.NewReader(make([]byte, maxBodyBytes)), strings.NewReader("x")))
	if err != nil {
		t.Fatal(err)
	}
	request.Header.Set("Authorization", "Bearer "+testToken)
	request.Header.Set("Content-Type", "application/x-protobuf")
	request.Header.Set("Content-Encoding", "snappy")
	response, err := http.DefaultClient.Do(request)
	if err == nil {
		response.Body.Close()
		if response.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("status %d, want 413", response.StatusCode)
		}
	} // the server may close the connection before the client finishes sending: the counter says it refused
	if request.ContentLength != 0 {
		t.Fatalf("the request has a length (%d): it tests the header check, not the reading", request.ContentLength)
	}
	if refusedCount(t, reasonTooLarge)-count != 1 {
		t.Error("the oversized chunked body is not counted as too_large")
	}
	if after := h.snapshot(); !reflect.DeepEqual(before, after) {
		t.Error("the snapshot changed")
	}
}

// Refusals are logged once per reason every logEvery; the lines left out are counted into the next one.
func TestRefusalLogsAreRateLimitedPerReason(t *testing.T) {
	var logs limitedLog
	for range 3 {
		logs.warn("snappy", "a bad block")
	}
	logs.warn("protobuf", "a bad message")
	if logs.skipped["snappy"] != 2 || logs.skipped["protobuf"] != 0 {
		t.Errorf("left out %v, want snappy 2 and protobuf 0", logs.skipped)
	}
	logs.last["snappy"] = time.Now().Add(-logEvery)
	logs.warn("snappy", "a bad block")
	if logs.skipped["snappy"] != 0 {
		t.Errorf("after logEvery the line is not written: %v left out", logs.skipped["snappy"])
	}
}

// A panic in the handler is answered 500, counted and logged; the server goes on.
func TestAPanicIsRecoveredAndCounted(t *testing.T) {
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte(testToken), 0o600); err != nil {
		t.Fatal(err)
	}
	broken := NewReceiver(nil, token) // no Store: the first write past the checks dereferences nil
	count := refusedCount(t, reasonPanic)
	for range 2 {
		request := httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body(deviceSeries("node-a", 0, 1, 0.5, 5000, 15000, t0))))
		request.Header.Set("Authorization", "Bearer "+testToken)
		request.Header.Set("Content-Type", "application/x-protobuf")
		request.Header.Set("Content-Encoding", "snappy")
		recorder := httptest.NewRecorder()
		broken.ServeHTTP(recorder, request)
		if recorder.Code != http.StatusInternalServerError {
			t.Errorf("status %d, want 500", recorder.Code)
		}
	}
	if got := refusedCount(t, reasonPanic) - count; got != 2 {
		t.Errorf("refused_total{reason=panic} moved by %g, want 2", got)
	}
}

// Writes, reads (Fetch, then Rank as the Refresher does) and decisions on the published snapshots at once: a node
// carried over keeps its ranking and memo, which decisions on the previous snapshot read meanwhile (run with -race).
func TestWritesReadsAndDecisionsAtOnce(t *testing.T) {
	h := newHarness(t)
	args := gpuscore.DefaultArgs()
	policy := args.Policy()
	var published atomic.Pointer[gpuscore.Snapshot]
	published.Store(&gpuscore.Snapshot{Nodes: map[string]*gpuscore.NodeMetrics{}})
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // Prometheus: node-a every round, node-b every fourth
		defer wg.Done()
		for i := range 40 {
			ms := t0 + int64(i)*1000
			write := [][]TimeSeries{deviceSeries("node-a", 0, 1, float64(i%10)/10, 5000, 15000, ms)}
			if i%4 == 0 {
				write = append(write, deviceSeries("node-b", 0, 1, 0.5, 5000, 15000, ms))
			}
			h.post(body(write...), nil)
		}
		close(done)
	}()
	go func() { // decisions
		defer wg.Done()
		request := []gpuscore.ResourceRequest{{Resource: "nvidia.com/mig-2g.20gb", Count: 1}}
		for {
			select {
			case <-done:
				return
			default:
			}
			snapshot := published.Load()
			for _, name := range snapshot.Order {
				gpuscore.Evaluate(name, snapshot.Nodes[name], request, &policy, h.now, nil, nil, false)
			}
		}
	}()
	for version := uint64(1); ; version++ {
		snapshot, err := h.source.Fetch(context.Background(), version)
		if err != nil {
			t.Fatal(err)
		}
		if snapshot != nil {
			snapshot.Rank(&policy)
			published.Store(snapshot)
		}
		select {
		case <-done:
			wg.Wait()
			final, _ := h.source.Fetch(context.Background(), version+1)
			if final != nil {
				published.Store(final)
			}
			if nodes := published.Load().Order; len(nodes) != 2 {
				t.Errorf("nodes %v after the writes", nodes)
			}
			return
		default:
			time.Sleep(time.Millisecond)
		}
	}
}

// FirstSample closes with the first kept sample: not with a refused write, nor with series a decision does not read.
func TestFirstSampleClosesWithTheFirstKeptSample(t *testing.T) {
	h := newHarness(t)
	closed := func() bool {
		select {
		case <-h.source.FirstSample():
			return true
		default:
			return false
		}
	}
	ms := int64(h.now * 1000)
	other := deviceSeries("node-a", 0, 1, 0.5, 10, 90, ms)[3:] // DCGM_FI_DEV_POWER_USAGE only
	if status := h.post(body(other), nil); status != http.StatusNoContent || closed() {
		t.Fatalf("a write of an unread series: status %d, FirstSample closed %v", status, closed())
	}
	if status := h.post(body(deviceSeries("node-a", 0, 1, 0.5, 10, 90, ms)), map[string]string{"Authorization": ""}); status != http.StatusUnauthorized || closed() {
		t.Fatalf("a refused write: status %d, FirstSample closed %v", status, closed())
	}
	if status := h.post(body(deviceSeries("node-a", 0, 1, 0.5, 10, 90, ms)), nil); status != http.StatusNoContent || !closed() {
		t.Fatalf("a kept sample: status %d, FirstSample closed %v", status, closed())
	}
}
