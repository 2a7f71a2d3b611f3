// Package podmetrics reads a pod's Prometheus /metrics for pav's benchmarks
// (test/bench, test/scale), which run on the single node of the local cluster.
package podmetrics

import (
	"context"
	"io"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
)

// Scrape reads http://<pod IP>:port/metrics of p directly (this is the node,
// and a read through the API server would add to the requests being counted),
// else through the API server's pod proxy.
func Scrape(ctx context.Context, client kubernetes.Interface, p *corev1.Pod, port string) (string, error) {
	if p.Status.PodIP != "" {
		hc := &http.Client{Timeout: 5 * time.Second}
		if resp, err := hc.Get("http://" + p.Status.PodIP + ":" + port + "/metrics"); err == nil {
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err == nil && resp.StatusCode == http.StatusOK {
				return string(b), nil
			}
		}
	}
	b, err := client.CoreV1().Pods(p.Namespace).ProxyGet("http", p.Name, port, "/metrics", nil).DoRaw(ctx)
	return string(b), err
}
