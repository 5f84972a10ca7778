package remotewrite

// The HTTP side: POST /api/v1/write with a bearer token, Content-Type application/x-protobuf and Content-Encoding
// snappy. Answers: 204 applied; 400 malformed (bad snappy, bad protobuf, a series without __name__); 401 no token
// or a wrong one (or the token file unreadable); 405 not a POST; 413 too large (the body, or the size its snappy
// header announces, checked before decompressing); 415 another content type or encoding (remote write 2.0's
// included: Prometheus then falls back to 1.0). Every refusal counts in remote_write_refused_total{reason} and is
// logged, at most once per reason every logEvery; nothing a sender sends panics the scheduler.

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/snappy"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
)

// Path is where the receiver takes writes (Prometheus' own receiver's path).
const Path = "/api/v1/write"

const (
	// MaxDecodedBytes bounds a request once decompressed: Prometheus' queue sends at most a few thousand samples
	// per request (max_samples_per_send), well under 1 MiB even with dcgm-exporter's full label set.
	MaxDecodedBytes = 8 << 20
	// logEvery is how often one reason of refusal is logged at most.
	logEvery = 10 * time.Second
)

// maxBodyBytes bounds the body as sent: the largest snappy block of MaxDecodedBytes.
var maxBodyBytes = snappy.MaxEncodedLen(MaxDecodedBytes)

// The reasons of refusal (remote_write_refused_total's reason label), the extender's words (remote_write.py):
// the log line says which check refused.
const (
	reasonUnauthorized    = "unauthenticated"
	reasonTokenFile       = "unauthenticated"
	reasonMethod          = "method"
	reasonContentType     = "unsupported_media"
	reasonContentEncoding = "unsupported_media"
	reasonTooLarge        = "too_large"
	reasonBody            = "malformed"
	reasonSnappy          = "malformed"
	reasonProtobuf        = "malformed"
	reasonNoName          = "malformed"
	reasonPanic           = "internal"
)

var (
	refused = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace:      "gpufleet",
		Subsystem:      "gpuscore",
		Name:           "remote_write_refused_total",
		Help:           "Remote-write requests GPUScore's receiver refused, by reason (unauthenticated, method, unsupported_media, too_large, malformed, internal).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"reason"})
	samplesAccepted = metrics.NewCounter(&metrics.CounterOpts{
		Namespace:      "gpufleet",
		Subsystem:      "gpuscore",
		Name:           "remote_write_samples_accepted_total",
		Help:           "Pushed samples of the series a decision reads that GPUScore's receiver kept.",
		StabilityLevel: metrics.ALPHA,
	})
	samplesOutOfOrder = metrics.NewCounter(&metrics.CounterOpts{
		Namespace:      "gpufleet",
		Subsystem:      "gpuscore",
		Name:           "remote_write_samples_out_of_order_total",
		Help:           "Pushed samples older than the one held for their series, ignored.",
		StabilityLevel: metrics.ALPHA,
	})
	seriesIgnored = metrics.NewCounter(&metrics.CounterOpts{
		Namespace:      "gpufleet",
		Subsystem:      "gpuscore",
		Name:           "remote_write_series_ignored_total",
		Help:           "Pushed series a decision does not read (another metric, job or namespace, or no node name label), dropped; many mean Prometheus' write_relabel_configs send more than needed.",
		StabilityLevel: metrics.ALPHA,
	})
	seriesOverLimit = metrics.NewCounter(&metrics.CounterOpts{
		Namespace:      "gpufleet",
		Subsystem:      "gpuscore",
		Name:           "remote_write_series_over_limit_total",
		Help:           "Samples of new pushed series not kept because the receiver holds its most series already (remotewrite.MaxSeries): Prometheus' write_relabel_configs let through more than the dcgm series a decision reads.",
		StabilityLevel: metrics.ALPHA,
	})
	registerMetrics sync.Once
)

// RegisterMetrics adds the receiver's metrics to the scheduler's /metrics (once per process).
func RegisterMetrics() {
	registerMetrics.Do(func() {
		legacyregistry.MustRegister(refused, samplesAccepted, samplesOutOfOrder, seriesIgnored, seriesOverLimit)
	})
}

// Receiver is the http.Handler that writes pushed samples into a Store.
type Receiver struct {
	store   *Store
	token   tokenFile
	buffers sync.Pool // *requestBuffers
	logs    limitedLog
}

type requestBuffers struct {
	body, decoded []byte
	request       decoded
}

// NewReceiver takes writes into store from senders that present the bearer token in the file tokenPath.
func NewReceiver(store *Store, tokenPath string) *Receiver {
	RegisterMetrics()
	r := &Receiver{store: store, token: tokenFile{path: tokenPath}}
	r.buffers.New = func() any { return new(requestBuffers) }
	return r
}

func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	defer func() {
		if p := recover(); p != nil {
			r.refuse(w, http.StatusInternalServerError, reasonPanic, fmt.Sprintf("a write from %s panicked the receiver: %v", req.RemoteAddr, p))
		}
	}()
	if req.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		r.refuse(w, http.StatusMethodNotAllowed, reasonMethod, fmt.Sprintf("%s %s from %s: only POST writes", req.Method, req.URL.Path, req.RemoteAddr))
		return
	}
	if reason, detail := r.token.check(req.Header.Get("Authorization")); reason != "" {
		r.refuse(w, http.StatusUnauthorized, reason, fmt.Sprintf("a write from %s: %s", req.RemoteAddr, detail))
		return
	}
	if problem := contentTypeProblem(req.Header.Get("Content-Type")); problem != "" {
		r.refuse(w, http.StatusUnsupportedMediaType, reasonContentType, fmt.Sprintf("a write from %s: %s", req.RemoteAddr, problem))
		return
	}
	if encoding := req.Header.Get("Content-Encoding"); !strings.EqualFold(encoding, "snappy") {
		r.refuse(w, http.StatusUnsupportedMediaType, reasonContentEncoding, fmt.Sprintf("a write from %s: Content-Encoding %q, snappy expected", req.RemoteAddr, encoding))
		return
	}
	if req.ContentLength > int64(maxBodyBytes) {
		r.refuse(w, http.StatusRequestEntityTooLarge, reasonTooLarge, fmt.Sprintf("a write from %s: %d bytes, at most %d taken", req.RemoteAddr, req.ContentLength, maxBodyBytes))
		return
	}
	buffers := r.buffers.Get().(*requestBuffers)
	defer r.buffers.Put(buffers)
	body, err := readBody(req.Body, buffers.body[:0])
	buffers.body = body[:0]
	if errors.Is(err, errTooLarge) {
		r.refuse(w, http.StatusRequestEntityTooLarge, reasonTooLarge, fmt.Sprintf("a write from %s: over %d bytes", req.RemoteAddr, maxBodyBytes))
		return
	}
	if err != nil {
		r.refuse(w, http.StatusBadRequest, reasonBody, fmt.Sprintf("a write from %s: the body did not arrive whole: %v", req.RemoteAddr, err))
		return
	}
	size, err := snappy.DecodedLen(body)
	if err != nil {
		r.refuse(w, http.StatusBadRequest, reasonSnappy, fmt.Sprintf("a write from %s: not a snappy block: %v", req.RemoteAddr, err))
		return
	}
	if size > MaxDecodedBytes {
		r.refuse(w, http.StatusRequestEntityTooLarge, reasonTooLarge, fmt.Sprintf("a write from %s: %d bytes once decompressed, at most %d taken", req.RemoteAddr, size, MaxDecodedBytes))
		return
	}
	if cap(buffers.decoded) < size {
		buffers.decoded = make([]byte, size)
	}
	decodedBody, err := snappy.Decode(buffers.decoded[:cap(buffers.decoded)], body)
	if err != nil {
		r.refuse(w, http.StatusBadRequest, reasonSnappy, fmt.Sprintf("a write from %s: not a snappy block: %v", req.RemoteAddr, err))
		return
	}
	request := &buffers.request
	if err := request.decode(decodedBody, &r.store.filter); err != nil {
		reason := reasonProtobuf
		if errors.Is(err, errNoName) {
			reason = reasonNoName
		}
		r.refuse(w, http.StatusBadRequest, reason, fmt.Sprintf("a write from %s: %v", req.RemoteAddr, err))
		return
	}
	result := r.store.apply(request)
	request.body = nil
	samplesAccepted.Add(float64(result.accepted))
	if result.outOfOrder > 0 {
		samplesOutOfOrder.Add(float64(result.outOfOrder))
	}
	if request.ignored > 0 {
		seriesIgnored.Add(float64(request.ignored))
	}
	if result.overLimit > 0 {
		seriesOverLimit.Add(float64(result.overLimit))
		r.logs.warn("series_limit", fmt.Sprintf("a write from %s: %d samples of new series not kept: the receiver holds %d series, its most "+
			"(check Prometheus' write_relabel_configs: only the dcgm series a decision reads, with the labels it reads)", req.RemoteAddr, result.overLimit, MaxSeries))
	}
	w.WriteHeader(http.StatusNoContent)
}

// refuse answers status, counts the refusal and logs it (rate-limited per reason). The answer's text is the
// reason alone: the log has the detail.
func (r *Receiver) refuse(w http.ResponseWriter, status int, reason, detail string) {
	refused.WithLabelValues(reason).Inc()
	r.logs.warn(reason, detail)
	http.Error(w, "remote write refused: "+reason, status)
}

// contentTypeProblem is why contentType is no remote write 1.0 body ("" when it is one).
func contentTypeProblem(contentType string) string {
	media, params, err := mime.ParseMediaType(contentType)
	if err != nil || media != "application/x-protobuf" {
		return fmt.Sprintf("Content-Type %q, application/x-protobuf expected", contentType)
	}
	if proto, ok := params["proto"]; ok && proto != "prometheus.WriteRequest" {
		return fmt.Sprintf("Content-Type %q: only remote write 1.0 (prometheus.WriteRequest) is taken", contentType)
	}
	return ""
}

var errTooLarge = errors.New("body too large")

// readBody reads body into buf, at most maxBodyBytes.
func readBody(body io.Reader, buf []byte) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			if len(buf) > maxBodyBytes {
				return buf, errTooLarge
			}
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if len(buf) > maxBodyBytes {
			return buf, errTooLarge
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// tokenFile is the bearer token a sender must present, read again when the file's size or modification time
// changes (a Secret the kubelet updates in place).
type tokenFile struct {
	path string

	mu      sync.Mutex
	size    int64
	modTime time.Time
	digest  [sha256.Size]byte
	problem string // why no token is there ("": digest holds it)
	read    bool
}

// check is "" when authorization presents the token, else the reason of refusal and its detail.
func (t *tokenFile) check(authorization string) (reason, detail string) {
	digest, problem := t.current()
	if problem != "" {
		return reasonTokenFile, problem
	}
	presented, ok := strings.CutPrefix(authorization, "Bearer ")
	if !ok {
		return reasonUnauthorized, "no bearer token"
	}
	sum := sha256.Sum256([]byte(presented)) // equal lengths: the comparison's time says nothing of the token
	if subtle.ConstantTimeCompare(sum[:], digest[:]) != 1 {
		return reasonUnauthorized, "a wrong bearer token"
	}
	return "", ""
}

func (t *tokenFile) current() ([sha256.Size]byte, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	info, err := os.Stat(t.path)
	if err != nil {
		t.read = false
		return t.digest, fmt.Sprintf("remoteWriteTokenFile %s cannot be read: %v", t.path, withoutPath(err))
	}
	if t.read && info.Size() == t.size && info.ModTime().Equal(t.modTime) {
		return t.digest, t.problem
	}
	raw, err := os.ReadFile(t.path)
	t.read, t.size, t.modTime = err == nil, info.Size(), info.ModTime()
	token := strings.TrimSpace(string(raw))
	switch {
	case err != nil:
		t.problem = fmt.Sprintf("remoteWriteTokenFile %s cannot be read: %v", t.path, withoutPath(err))
	case token == "":
		t.problem = fmt.Sprintf("remoteWriteTokenFile %s is empty", t.path)
	case strings.ContainsAny(token, "\r\n"):
		t.problem = fmt.Sprintf("remoteWriteTokenFile %s holds more than one line (one token expected)", t.path)
	default:
		t.problem, t.digest = "", sha256.Sum256([]byte(token))
	}
	return t.digest, t.problem
}

func withoutPath(err error) error {
	var pathErr *os.PathError
	if errors.As(err, &pathErr) {
		return pathErr.Err
	}
	return err
}

// limitedLog logs a WARNING per reason at most once every logEvery, with how many it left out meanwhile.
type limitedLog struct {
	mu      sync.Mutex
	last    map[string]time.Time
	skipped map[string]int
}

func (l *limitedLog) warn(reason, detail string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last, l.skipped = map[string]time.Time{}, map[string]int{}
	}
	now := time.Now()
	if last, ok := l.last[reason]; ok && now.Sub(last) < logEvery {
		l.skipped[reason]++
		return
	}
	more := ""
	if n := l.skipped[reason]; n > 0 {
		more = fmt.Sprintf(" (and %d more refused for %s since the last line)", n, reason)
	}
	l.last[reason], l.skipped[reason] = now, 0
	klog.Warningf("GPUScore remote write refused (%s): %s%s", reason, detail, more)
}

// Serve listens on address and serves the receiver there until ctx ends: https with the PEM pair certFile and
// keyFile (read now), plain http without. It returns the address listened on, or why it cannot listen.
func (r *Receiver) Serve(ctx context.Context, address, certFile, keyFile string) (net.Addr, error) {
	var tlsConfig *tls.Config
	if certFile != "" || keyFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("remoteWriteCertFile/remoteWriteKeyFile: %v", err)
		}
		tlsConfig = &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	}
	listener, err := net.Listen("tcp", address)
	if err != nil {
		return nil, fmt.Errorf("remoteWriteAddress %s: %v", address, err)
	}
	mux := http.NewServeMux()
	mux.Handle(Path, r)
	server := &http.Server{
		Handler:           mux,
		TLSConfig:         tlsConfig,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          nil,
	}
	go func() {
		var err error
		if tlsConfig != nil {
			err = server.ServeTLS(listener, "", "")
		} else {
			err = server.Serve(listener)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.Errorf("GPUScore remote-write receiver on %s stopped: %v", address, err)
		}
	}()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = server.Shutdown(shutdown)
	}()
	klog.InfoS("GPUScore remote-write receiver listening", "address", listener.Addr().String(), "path", Path, "https", tlsConfig != nil)
	return listener.Addr(), nil
}
