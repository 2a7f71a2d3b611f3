// Package kubeconfig finds the API server for pav's binaries: a kubeconfig
// file when one is given, else the in-cluster ServiceAccount.
package kubeconfig

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
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
