package gpumetrics

// The metrics path: Prometheus over https with a pinned CA (prometheusCAFile) and a bearer token re-read at each
// refresh (prometheusTokenFile), against real TLS servers on 127.0.0.1.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpufleet/mig/k8s/gpuscore"

	"k8s.io/apimachinery/pkg/runtime"
)

// tokenRecorder answers both queries with one node and records the Authorization header of each request.
type tokenRecorder struct {
	mu   sync.Mutex
	seen []string
}

func (r *tokenRecorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	r.seen = append(r.seen, req.Header.Get("Authorization"))
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if strings.Contains(req.URL.Query().Get("query"), "timestamp(") {
		fmt.Fprint(w, `{"status":"success","data":{"resultType":"vector","result":[{"metric":{"Hostname":"n1"},"value":[1,"1700000000"]}]}}`)
		return
	}
	fmt.Fprint(w, `{"status":"success","data":{"resultType":"vector","result":[
		{"metric":{"__name__":"DCGM_FI_DEV_GPU_UTIL","Hostname":"n1","gpu":"0"},"value":[1,"40"]}]}}`)
}

func (r *tokenRecorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := r.seen
	r.seen = nil
	return seen
}

func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func certPEM(cert *x509.Certificate) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}))
}

// otherCAServer is a TLS server for 127.0.0.1 whose certificate a CA of its own issued (not httptest's), and
// that CA's PEM.
func otherCAServer(t *testing.T, handler http.Handler) (*httptest.Server, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTemplate := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "other CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	leafTemplate := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTemplate, ca, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	server := httptest.NewUnstartedServer(handler)
	server.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{leafDER}, PrivateKey: key}}}
	server.StartTLS()
	t.Cleanup(server.Close)
	return server, certPEM(ca)
}

func pinnedSource(t *testing.T, url, caFile, tokenFile string) *PrometheusSource {
	t.Helper()
	source := newPrometheusSource(url, []string{"Hostname"}, 2*time.Second, 5, "")
	if err := source.pinCA(caFile); err != nil {
		t.Fatal(err)
	}
	source.useTokenFile(tokenFile)
	return source
}

func TestPinnedCAAcceptsItsServerAndRefusesAnotherCAs(t *testing.T) {
	dir := t.TempDir()
	recorder := &tokenRecorder{}
	trusted := httptest.NewTLSServer(recorder)
	defer trusted.Close()
	caFile := writeFile(t, dir, "ca.crt", certPEM(trusted.Certificate()))
	tokenFile := writeFile(t, dir, "token", "t0ken\n")

	snapshot, err := pinnedSource(t, trusted.URL, caFile, tokenFile).Fetch(context.Background(), 1)
	if err != nil {
		t.Fatalf("the pinned CA's server: %v", err)
	}
	if got := snapshot.Nodes["n1"]; got == nil || got.Devices[gpuscore.WholeGPUResource][0].Util != 0.4 {
		t.Errorf("snapshot from the pinned server: %+v", snapshot.Nodes)
	}

	// A server whose certificate another CA issued (what answers when someone captures the address) is refused
	// before any query, so before the token is sent.
	impostor := &tokenRecorder{}
	other, otherCA := otherCAServer(t, impostor)
	_, err = pinnedSource(t, other.URL, caFile, tokenFile).Fetch(context.Background(), 1)
	if err == nil || !strings.Contains(err.Error(), "Prometheus unreachable") || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("another CA's server: got %v, want a certificate error", err)
	}
	if seen := impostor.take(); len(seen) != 0 {
		t.Errorf("the impostor received %d requests (token %q)", len(seen), seen)
	}
	if strings.Contains(fmt.Sprint(err), "t0ken") {
		t.Errorf("the error shows the token: %v", err)
	}

	// Pinned to the other CA, the first server is refused in turn: the pin follows the file, not the first server.
	otherCAFile := writeFile(t, dir, "other.crt", otherCA)
	if _, err := pinnedSource(t, trusted.URL, otherCAFile, tokenFile).Fetch(context.Background(), 1); err == nil {
		t.Error("a server the pinned CA did not issue was accepted")
	}
	if _, err := pinnedSource(t, other.URL, otherCAFile, tokenFile).Fetch(context.Background(), 1); err != nil {
		t.Errorf("the other CA's own server: %v", err)
	}
}

func TestTokenIsSentAndReReadAtEachRefresh(t *testing.T) {
	dir := t.TempDir()
	recorder := &tokenRecorder{}
	server := httptest.NewTLSServer(recorder)
	defer server.Close()
	caFile := writeFile(t, dir, "ca.crt", certPEM(server.Certificate()))
	tokenFile := writeFile(t, dir, "token", "first-token\n")
	source := pinnedSource(t, server.URL, caFile, tokenFile)

	if _, err := source.Fetch(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if seen := recorder.take(); len(seen) != 2 || seen[0] != "Bearer first-token" || seen[1] != "Bearer first-token" {
		t.Errorf("first refresh sent %q, want the token on both queries", seen)
	}
	// Rotation, as the kubelet does it for a mounted Secret: the file changes, the source keeps running.
	writeFile(t, dir, "token", "second-token")
	if _, err := source.Fetch(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	if seen := recorder.take(); len(seen) != 2 || seen[0] != "Bearer second-token" || seen[1] != "Bearer second-token" {
		t.Errorf("after rotation sent %q, want the new token", seen)
	}

	// Unreadable or empty: the refresh fails with a message naming the file, and nothing is queried.
	for _, c := range []struct{ name, text, want string }{
		{"empty", " \n", "prometheusTokenFile " + tokenFile + " is empty"},
		{"missing", "", "cannot read prometheusTokenFile " + tokenFile + ": no such file or directory"},
		{"two lines", "one\ntwo", "prometheusTokenFile " + tokenFile + " holds more than one line"},
	} {
		if c.name == "missing" {
			os.Remove(tokenFile)
		} else {
			writeFile(t, dir, "token", c.text)
		}
		_, err := source.Fetch(context.Background(), 3)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s token file: got %v, want %q", c.name, err, c.want)
		}
		if seen := recorder.take(); len(seen) != 0 {
			t.Errorf("%s token file: %d queries sent", c.name, len(seen))
		}
	}

	// Without a token file no Authorization header is sent (the extender's behaviour with the setting unset).
	open := newPrometheusSource(server.URL, []string{"Hostname"}, 2*time.Second, 5, "")
	if err := open.pinCA(caFile); err != nil {
		t.Fatal(err)
	}
	if _, err := open.Fetch(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if seen := recorder.take(); len(seen) != 2 || seen[0] != "" || seen[1] != "" {
		t.Errorf("no token file: sent %q", seen)
	}
}

func TestAFailingTokenFileMakesTheRefreshFailWithItsMessage(t *testing.T) {
	dir := t.TempDir()
	server := httptest.NewTLSServer(&tokenRecorder{})
	defer server.Close()
	caFile := writeFile(t, dir, "ca.crt", certPEM(server.Certificate()))
	tokenFile := filepath.Join(dir, "absent")
	args := gpuscore.DefaultArgs()
	refresher := NewRefresher(pinnedSource(t, server.URL, caFile, tokenFile), time.Second, args.Policy())
	if refresher.RefreshOnce(context.Background()) {
		t.Fatal("a refresh without a readable token file succeeded")
	}
	if want := "cannot read prometheusTokenFile " + tokenFile; !strings.Contains(refresher.lastError, want) {
		t.Errorf("refresh failure %q, want %q", refresher.lastError, want)
	}
}

func TestCAFileProblemsStopTheSchedulerWithTheOtherArgsProblems(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.crt")
	notPEM := writeFile(t, dir, "not-pem.crt", "not a certificate\n")
	for _, c := range []struct{ caFile, want string }{
		{missing, "prometheusCAFile: cannot read " + missing + ": no such file or directory"},
		{notPEM, "prometheusCAFile: no PEM certificate in " + notPEM},
	} {
		raw := fmt.Sprintf(`{"prometheusURL":"https://prometheus.example:9090","prometheusCAFile":%q,"weightGPUUtil":0.5}`, c.caFile)
		_, _, err := StartMetrics(context.Background(), &runtime.Unknown{Raw: []byte(raw), ContentType: runtime.ContentTypeJSON}, "GPUScore")
		if err == nil {
			t.Fatalf("%s: the plugin started", c.caFile)
		}
		// Every problem in one error: the CA file's and the args' own.
		for _, want := range []string{c.want, "weightGPUUtil + weightMemUtil must be 1.0 (got 0.5 + 0.3 = 0.8)"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error %q lacks %q", c.caFile, err, want)
			}
		}
	}
}

func TestACAFileNeedsAnHTTPSURL(t *testing.T) {
	args, problems := gpuscore.ParseArgs(&runtime.Unknown{
		Raw:         []byte(`{"prometheusURL":"http://prometheus:9090","prometheusCAFile":"/ca.crt","prometheusTokenFile":"/token"}`),
		ContentType: runtime.ContentTypeJSON,
	})
	want := `prometheusCAFile needs an https:// prometheusURL (got "http://prometheus:9090")`
	if len(problems) != 1 || problems[0] != want {
		t.Errorf("problems %q, want [%q]", problems, want)
	}
	if args.PrometheusCAFile != "/ca.crt" || args.PrometheusTokenFile != "/token" {
		t.Errorf("decoded %q, %q", args.PrometheusCAFile, args.PrometheusTokenFile)
	}
}
