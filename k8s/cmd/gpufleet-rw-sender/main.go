// gpufleet-rw-sender stands in for Prometheus' remote write where a real Prometheus cannot scrape the fleet: every
// interval it sends the samples dcgm-exporter would give N nodes x G GPUs x K MIG instances (the exporter's full label
// set as a Prometheus Operator scrape labels it, only the series a decision reads, as write_relabel_configs keep
// them), stamped with the interval's start, in requests of at most -max-samples-per-send series, spread evenly over
// the interval across -shards connections as Prometheus' queue does. Each interval it prints what it sent and what
// the receiver answered. With -exposition it sends a fleet's dcgm-exporter text instead (each file one scrape
// target's answer, as Prometheus would scrape, relabel and send it: -keep-labels are the labels the roles'
// write_relabel_configs keep), the same values every interval.
//
//	gpufleet-rw-sender -url http://127.0.0.1:9402/api/v1/write -token-file token -nodes 5000 -intervals 4
//	gpufleet-rw-sender -url ... -token-file token -exposition shard-0.txt,shard-1.txt -keep-labels __name__,Hostname,...
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpufleet/mig/k8s/gpumetrics/remotewrite/rwbench"
	"github.com/gpufleet/mig/k8s/gpuscore"
)

func main() {
	url := flag.String("url", "http://127.0.0.1:9402/api/v1/write", "the receiver's remote-write URL")
	tokenFile := flag.String("token-file", "", "file holding the bearer token (required)")
	caFile := flag.String("ca-file", "", "PEM CA the receiver's https certificate must chain to (https only)")
	nodes := flag.Int("nodes", 1000, "nodes")
	gpus := flag.Int("gpus", 8, "GPUs per node")
	instances := flag.Int("instances", 7, "MIG instances per GPU")
	profile := flag.String("profile", "1g.10gb", "the instances' MIG profile")
	job := flag.String("job", "dcgm-exporter", "the scrape's job label")
	namespace := flag.String("namespace", "gpufleet-node-agents", "the scrape's namespace label")
	interval := flag.Duration("interval", 15*time.Second, "scrape interval")
	perSend := flag.Int("max-samples-per-send", 2000, "series per request at most (Prometheus' queue_config)")
	shards := flag.Int("shards", 4, "requests in flight at once (Prometheus' queue shards)")
	intervals := flag.Int("intervals", 0, "intervals to send (0: until stopped)")
	exposition := flag.String("exposition", "", "comma-separated dcgm-exporter text files, one per scrape target, sent instead of -nodes x -gpus x -instances")
	keepLabels := flag.String("keep-labels", "", "with -exposition: comma-separated labels kept (write_relabel_configs' labelkeep); empty: all")
	flag.Parse()
	var traffic Traffic = rwbench.Fleet{Nodes: *nodes, GPUs: *gpus, Instances: *instances, Profile: *profile, Job: *job, Namespace: *namespace}
	if *exposition != "" {
		var keep []string
		if *keepLabels != "" {
			keep = strings.Split(*keepLabels, ",")
		}
		read, err := rwbench.ReadExposition(strings.Split(*exposition, ","), *job, *namespace, gpuscore.DCGMMetrics(), keep)
		if err != nil {
			fmt.Fprintln(os.Stderr, "gpufleet-rw-sender: -exposition:", err)
			os.Exit(1)
		}
		traffic = read
	}
	if err := run(*url, *tokenFile, *caFile, traffic, *interval, *perSend, *shards, *intervals); err != nil {
		fmt.Fprintln(os.Stderr, "gpufleet-rw-sender:", err)
		os.Exit(1)
	}
}

// Traffic is what an interval sends: a synthetic fleet (rwbench.Fleet) or exporter text (rwbench.Exposition).
type Traffic interface {
	Requests(ms int64, interval, perSend int) [][]byte
	SeriesPerInterval() int
}

func run(url, tokenFile, caFile string, traffic Traffic, interval time.Duration, perSend, shards, intervals int) error {
	if tokenFile == "" {
		return fmt.Errorf("-token-file is required (the receiver refuses a sender without its token)")
	}
	raw, err := os.ReadFile(tokenFile)
	if err != nil {
		return fmt.Errorf("-token-file: %v", err)
	}
	token := strings.TrimSpace(string(raw))
	if fleet, ok := traffic.(rwbench.Fleet); ok && (fleet.Nodes < 1 || fleet.GPUs < 1 || fleet.Instances < 1) {
		return fmt.Errorf("-nodes, -gpus and -instances must be positive")
	}
	if traffic.SeriesPerInterval() < 1 || perSend < 1 || shards < 1 || interval <= 0 {
		return fmt.Errorf("nothing to send, or -max-samples-per-send, -shards or -interval not positive")
	}
	client := &http.Client{Timeout: 30 * time.Second}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return fmt.Errorf("-ca-file: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("-ca-file: no PEM certificate in %s", caFile)
		}
		client.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, MaxIdleConnsPerHost: shards}
	} else {
		client.Transport = &http.Transport{MaxIdleConnsPerHost: shards}
	}
	what := "the exposition's series"
	if fleet, ok := traffic.(rwbench.Fleet); ok {
		what = fmt.Sprintf("%d nodes x %d GPUs x %d instances", fleet.Nodes, fleet.GPUs, fleet.Instances)
	}
	fmt.Printf("%s: %d samples every %v to %s, %d per request, %d shards\n", what, traffic.SeriesPerInterval(), interval, url, perSend, shards)
	next := time.Now()
	for i := 0; intervals == 0 || i < intervals; i++ {
		bodies := traffic.Requests(next.UnixMilli(), i, perSend) // stamped with the interval's start, as a scrape
		stats := send(client, url, token, bodies, next, interval, shards)
		fmt.Printf("interval %d: %d requests, %d answered 2xx, %s; request latency p50 %v, max %v; %v behind the pace at the end\n",
			i, len(bodies), stats.ok, stats.refusals(), stats.percentile(0.5), stats.percentile(1), stats.behind.Round(time.Millisecond))
		next = next.Add(interval)
		if wait := time.Until(next); wait > 0 {
			time.Sleep(wait)
		}
	}
	return nil
}

type intervalStats struct {
	mu        sync.Mutex
	ok        int
	statuses  map[string]int
	latencies []time.Duration
	behind    time.Duration
}

func (s *intervalStats) refusals() string {
	if len(s.statuses) == 0 {
		return "none refused"
	}
	var parts []string
	for status, n := range s.statuses {
		parts = append(parts, fmt.Sprintf("%d %s", n, status))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

func (s *intervalStats) percentile(p float64) time.Duration {
	if len(s.latencies) == 0 {
		return 0
	}
	sorted := slices.Clone(s.latencies)
	slices.Sort(sorted)
	return sorted[min(len(sorted)-1, int(p*float64(len(sorted))))].Round(time.Microsecond)
}

// send sends bodies spread evenly over the interval from start, shards at a time.
func send(client *http.Client, url, token string, bodies [][]byte, start time.Time, interval time.Duration, shards int) *intervalStats {
	stats := &intervalStats{statuses: map[string]int{}}
	queue := make(chan []byte)
	var wg sync.WaitGroup
	for range shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for body := range queue {
				request, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
				request.Header.Set("Authorization", "Bearer "+token)
				request.Header.Set("Content-Type", "application/x-protobuf")
				request.Header.Set("Content-Encoding", "snappy")
				request.Header.Set("User-Agent", "gpufleet-rw-sender")
				request.Header.Set("X-Prometheus-Remote-Write-Version", "0.1.0")
				began := time.Now()
				response, err := client.Do(request)
				took := time.Since(began)
				stats.mu.Lock()
				switch {
				case err != nil:
					stats.statuses["failed: "+err.Error()]++
				case response.StatusCode/100 == 2:
					stats.ok++
				default:
					stats.statuses[response.Status]++
				}
				stats.latencies = append(stats.latencies, took)
				stats.mu.Unlock()
				if response != nil {
					response.Body.Close()
				}
			}
		}()
	}
	for k, body := range bodies {
		at := start.Add(interval * time.Duration(k) / time.Duration(len(bodies)))
		if wait := time.Until(at); wait > 0 {
			time.Sleep(wait)
		}
		queue <- body
	}
	close(queue)
	wg.Wait()
	stats.behind = max(0, time.Since(start.Add(interval*time.Duration(len(bodies)-1)/time.Duration(len(bodies)))))
	return stats
}
