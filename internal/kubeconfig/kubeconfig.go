// Package kubeconfig finds the API server for pav's binaries: a kubeconfig
// file when one is given, else the in-cluster ServiceAccount. Importing it
// also turns on client-go's request metrics (rest_client_requests_total
// {code,method,host}, rest_client_request_duration_seconds{verb,host}, …),
// which every client built from a config it returns records into, and which
// Gatherer serves, so that the API requests pav makes can be counted.
package kubeconfig

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	// Registers client-go's request metrics (k8s.io/client-go/tools/metrics)
	// into legacyregistry in its init.
	_ "k8s.io/component-base/metrics/prometheus/restclient"
)

// Load returns the client configuration from path, or the in-cluster one
// when path is empty.
func Load(path string) (*rest.Config, error) {
	if path != "" {
		return clientcmd.BuildConfigFromFlags("", path)
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("not running in a cluster, give --kubeconfig: %w", err)
	}
	return cfg, nil
}

// Gatherer holds client-go's request metrics, with the process (RSS, CPU,
// start time) and Go runtime collectors: serve it on /metrics.
func Gatherer() metrics.Gatherer { return legacyregistry.DefaultGatherer }
