// Package kubeconfig finds the API server for pav's binaries: a kubeconfig
// file when one is given, else the in-cluster ServiceAccount. Importing it
// also turns on client-go's request metrics (rest_client_requests_total
// {code,method,host}, rest_client_request_duration_seconds{verb,host}, …),
// which every client built from a config it returns records into, and which
// Gatherer serves, so that the API requests pav makes can be counted.
package kubeconfig

import (
	"flag"
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	// Registers client-go's request metrics (k8s.io/client-go/tools/metrics)
	// into legacyregistry in its init.
	_ "k8s.io/component-base/metrics/prometheus/restclient"
)

// Rate is how fast a pav process may send API requests (client-go's
// token bucket: QPS sustained, Burst at once). client-go's own defaults (5 and
// 10) throttled a controller plugin creating 20 volumes at once: each volume
// costs some 17 requests, so 20 of them waited seconds on the client side
// while the API server was idle. The defaults here are those of
// kube-controller-manager's busiest controllers' order; every request pav
// makes is for one volume operation in flight, so the rate is bounded by the
// work, not by cluster size, and the API server's priority and fairness still
// applies on its side.
type Rate struct {
	QPS   float64 `json:"qps"`
	Burst int     `json:"burst"`
}

// The flags of a Rate: the names external-provisioner and the other CSI
// sidecars use, so that the manager sets pav's and theirs alike.
const (
	FlagQPS   = "kube-api-qps"
	FlagBurst = "kube-api-burst"
)

// DefaultRate is the rate pav's processes use unless told otherwise.
var DefaultRate = Rate{QPS: 50, Burst: 100}

// AddFlags registers --kube-api-qps and --kube-api-burst on fs, defaulting to r.
func (r *Rate) AddFlags(fs *flag.FlagSet) {
	fs.Float64Var(&r.QPS, FlagQPS, r.QPS, "API requests per second this process may send, sustained")
	fs.IntVar(&r.Burst, FlagBurst, r.Burst, "API requests this process may send at once, above --"+FlagQPS)
}

// Validate names the flag to fix.
func (r Rate) Validate() error {
	switch {
	case r.QPS <= 0:
		return fmt.Errorf("--%s must be positive, got %v", FlagQPS, r.QPS)
	case r.Burst < 1:
		return fmt.Errorf("--%s must be at least 1, got %d", FlagBurst, r.Burst)
	}
	return nil
}

// Load returns the client configuration from path, or the in-cluster one
// when path is empty, sending at most rate (DefaultRate where rate is zero).
// Its requests wait out an API server outage (outage.go).
func Load(path string, rate Rate) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if path != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", path)
	} else if cfg, err = rest.InClusterConfig(); err != nil {
		err = fmt.Errorf("not running in a cluster, give --kubeconfig: %w", err)
	}
	if err != nil {
		return nil, err
	}
	if rate == (Rate{}) {
		rate = DefaultRate
	}
	// One bucket for every client built from cfg (typed, dynamic): with only
	// QPS and Burst set, each client makes its own, and the process may send
	// the rate once per client.
	cfg.QPS, cfg.Burst = float32(rate.QPS), rate.Burst
	cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(cfg.QPS, cfg.Burst)
	// Requests that cannot reach the API server wait for its return (see
	// outage.go); one outage per process, shared by every client of cfg.
	cfg.Wrap(newOutage().wrap)
	return cfg, nil
}

// Gatherer holds client-go's request metrics, with the process (RSS, CPU,
// start time) and Go runtime collectors: serve it on /metrics.
func Gatherer() metrics.Gatherer { return legacyregistry.DefaultGatherer }
