package kubeconfig

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// Waiting out an API server outage.
//
// A request that could not even connect to the API server (its dial failed:
// the server is down, restarting or unreachable) waits until the API server
// is ready again, within the request's context, and is then sent again; it
// never reached the server, so sending it again is safe for every verb. One
// prober per process asks the API server's /readyz meanwhile, so that the
// waiting requests go on within a few seconds of its return.
//
// Why: client-go's informers retry a failed list or watch with a back-off
// that grows to 30 s plus up to 100% jitter (tools/cache/reflector.go:
// defaultBackoffMax, defaultBackoffJitter). After an outage of a few minutes
// every informer's next try came up to 60 s after the API server's return,
// and meanwhile the caches were stale: on the local cluster, a creation pod
// that had succeeded during a 5-minute outage was seen 37 s after the
// return, and the pav manager's informers synced 11–42 s after it. Worse,
// requests that reach an API server still starting are refused for reasons
// that are not the object's (403: its authorizer has not loaded RBAC yet;
// 404: a custom resource's API not installed yet; kube-controller-manager
// logged both 1.4 s before /readyz answered ok), and each such answer costs
// an informer another full back-off. Holding requests until /readyz says ok
// avoids both: the informers never fail during the outage, so their back-off
// never grows, and none of their requests lands in the starting window.
//
// A request whose dial failed after it was sent on a connection (reset, EOF,
// a lost HTTP/2 connection) is not sent again: the server may have acted on
// it. Its caller retries as before; its next request dials, and waits here.

// Probe intervals: the first probe comes probeFirst after the failure, each
// next one twice as late, up to probeMax, each with up to 50% jitter. At
// probeMax, 1,000 driver processes ask some 170 times a second: requests that
// the API server refuses at the TCP level while it is down, and answers from
// memory (/readyz is exempt from priority and fairness) while it starts.
const (
	probeFirst   = 500 * time.Millisecond
	probeMax     = 4 * time.Second
	probeTimeout = 5 * time.Second
)

// outage is one process's view of whether the API server answers.
type outage struct {
	mu    sync.Mutex
	ready chan struct{} // nil while the API server answers; closed when it answers again
	since time.Time     // when the current outage began
	cause error         // the dial error that began it
	// what the prober asks, and through which transport: /readyz of the host
	// of the last failed request, with its credentials
	probeURL string
	header   http.Header
	via      http.RoundTripper

	interval func(attempt int) time.Duration // test hook
	now      func() time.Time
}

func newOutage() *outage {
	return &outage{interval: probeInterval, now: time.Now}
}

func probeInterval(attempt int) time.Duration {
	d := probeFirst << min(attempt, 8)
	d = min(d, probeMax)
	return d + rand.N(d/2+1)
}

// wrap is a rest.Config WrapTransport: the clients built from one config
// share the outage.
func (o *outage) wrap(rt http.RoundTripper) http.RoundTripper {
	return &outageTransport{o: o, rt: rt}
}

type outageTransport struct {
	o  *outage
	rt http.RoundTripper
}

func (t *outageTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	for {
		if err := t.o.wait(req.Context()); err != nil {
			return nil, err
		}
		resp, err := t.rt.RoundTrip(req)
		if err == nil || !dialFailed(err) || req.Context().Err() != nil {
			return resp, err
		}
		next, rerr := resend(req)
		if rerr != nil {
			return nil, err // a body that cannot be read again: the caller retries
		}
		t.o.down(req, t.rt, err)
		req = next
	}
}

// dialFailed: the request could not connect, so it was never sent.
func dialFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// resend is req to send again: a copy with its body from the start.
func resend(req *http.Request) (*http.Request, error) {
	next := req.Clone(req.Context())
	if req.Body == nil || req.Body == http.NoBody {
		return next, nil
	}
	if req.GetBody == nil {
		return nil, errors.New("the request's body cannot be read again")
	}
	body, err := req.GetBody()
	if err != nil {
		return nil, err
	}
	next.Body = body
	return next, nil
}

// wait returns at once while the API server answers; during an outage it
// waits for its end or for ctx.
func (o *outage) wait(ctx context.Context) error {
	o.mu.Lock()
	ready, since, cause := o.ready, o.since, o.cause
	o.mu.Unlock()
	if ready == nil {
		return nil
	}
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for the API server, unreachable since %s (%v): %w", since.Format(time.RFC3339), cause, context.Cause(ctx))
	}
}

// down records that req could not connect, and starts the prober unless an
// outage is already under way.
func (o *outage) down(req *http.Request, via http.RoundTripper, cause error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	u := url.URL{Scheme: req.URL.Scheme, Host: req.URL.Host, Path: "/readyz"}
	o.probeURL, o.via = u.String(), via
	o.header = http.Header{}
	for _, h := range []string{"Authorization", "User-Agent"} {
		if v := req.Header.Get(h); v != "" {
			o.header.Set(h, v)
		}
	}
	if o.ready != nil {
		return
	}
	o.ready, o.since, o.cause = make(chan struct{}), o.now(), cause
	klog.InfoS("The API server is unreachable: API requests wait for it to be ready again", "err", cause)
	go o.probe(o.ready)
}

// probe asks /readyz until the API server is ready, then lets the waiting
// requests go.
func (o *outage) probe(ready chan struct{}) {
	told := o.now()
	for attempt := 0; ; attempt++ {
		time.Sleep(o.interval(attempt))
		o.mu.Lock()
		target, header, via, since := o.probeURL, o.header.Clone(), o.via, o.since
		o.mu.Unlock()
		err := answered(target, header, via)
		if err == nil {
			break
		}
		// Once a minute: an API server that never answers (a wrong
		// address, a network policy) must not go unnoticed.
		if now := o.now(); now.Sub(told) >= time.Minute {
			told = now
			klog.InfoS("Still waiting for the API server", "unreachableFor", now.Sub(since).Round(time.Second), "readyz", target, "err", err)
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	klog.InfoS("The API server is ready again: waiting API requests go on", "unreachableFor", o.now().Sub(o.since).Round(time.Second))
	close(ready)
	o.ready = nil
}

// answered is nil once the API server says it is ready (/readyz 200), or
// answers in a way that says nothing about its readiness (401, 403, 404:
// /readyz not allowed to this client, or not served by a proxy in front of
// it), in which case the requests go on and find out; else why not.
func answered(target string, header http.Header, via http.RoundTripper) error {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return nil
	}
	req.Header = header
	resp, err := via.RoundTrip(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode >= http.StatusInternalServerError || resp.StatusCode == http.StatusTooManyRequests {
		return fmt.Errorf("/readyz answered %s", resp.Status)
	}
	return nil
}
