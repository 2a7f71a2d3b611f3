package kube

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/version"
)

// APICheckInterval is how long an answer of the API server vouches for it
// in a readiness check. The kubelet probes every 5 s: asking the API server
// each time cost every pav process 12 requests a minute, idle or not, and a
// cluster of 1,000 nodes with 10 provisioners 2,000 requests a second for
// nothing but probes. An outage is still seen within a minute, and the end
// of one at the next probe.
const APICheckInterval = time.Minute

// apiCheckTimeout bounds one question: during an outage the request waits
// for the API server (kubeconfig's outage.go), and readiness must answer the
// kubelet within its probe's timeout (5 s in pav's manifests).
const apiCheckTimeout = 3 * time.Second

// APICheck is readiness's "the API server answers": asked at most once per
// APICheckInterval while it answers, and at every check while it does not.
type APICheck struct {
	Client interface {
		ServerVersion(ctx context.Context) (*version.Info, error)
	}
	Now func() time.Time // time.Now when nil

	mu       sync.Mutex
	answered time.Time // the API server's last answer
}

// Check says why the API server does not answer, or nil.
func (c *APICheck) Check(ctx context.Context) error {
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.answered.IsZero() && now().Sub(c.answered) < APICheckInterval {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, apiCheckTimeout)
	defer cancel()
	if _, err := c.Client.ServerVersion(ctx); err != nil {
		return fmt.Errorf("the Kubernetes API is not reachable: %w", err)
	}
	c.answered = now()
	return nil
}
