package kubeconfig

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// freeAddr is a local address nothing listens on (until the test does).
func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

func fastOutage() *outage {
	o := newOutage()
	o.interval = func(int) time.Duration { return 20 * time.Millisecond }
	return o
}

// A request that cannot connect waits for the API server's /readyz to say ok,
// then goes, body and credentials intact; every other request of the process
// waits for the same probe.
func TestOutageRequestsWaitForReadyz(t *testing.T) {
	addr := freeAddr(t)
	o := fastOutage()
	rt := o.wrap(http.DefaultTransport.(*http.Transport).Clone())

	type result struct {
		code int
		body string
		err  error
	}
	send := func(method, body string) <-chan result {
		out := make(chan result, 1)
		go func() {
			var rd io.Reader
			if body != "" {
				rd = strings.NewReader(body)
			}
			req, _ := http.NewRequestWithContext(t.Context(), method, "http://"+addr+"/api/v1/pods", rd)
			req.Header.Set("Authorization", "Bearer secret")
			resp, err := rt.RoundTrip(req)
			if err != nil {
				out <- result{err: err}
				return
			}
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			out <- result{code: resp.StatusCode, body: string(b)}
		}()
		return out
	}
	post, get := send(http.MethodPost, "the object"), send(http.MethodGet, "")
	time.Sleep(200 * time.Millisecond) // several probes, all refused
	select {
	case r := <-post:
		t.Fatalf("the request returned during the outage: %+v", r)
	default:
	}

	var readyz, notReady atomic.Int32
	var mu sync.Mutex
	var auth []string
	mux := http.NewServeMux()
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auth = append(auth, r.Header.Get("Authorization"))
		mu.Unlock()
		if readyz.Add(1) <= 3 { // starting: not ready yet
			notReady.Add(1)
			http.Error(w, "[-]poststarthook/rbac/bootstrap-roles failed", http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	mux.HandleFunc("/api/v1/pods", func(w http.ResponseWriter, r *http.Request) {
		if notReady.Load() < 3 {
			t.Errorf("a %s reached the API server before /readyz said ok", r.Method)
		}
		b, _ := io.ReadAll(r.Body)
		_, _ = w.Write([]byte(r.Method + " " + string(b)))
	})
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })

	for what, ch := range map[string]<-chan result{"POST": post, "GET": get} {
		select {
		case r := <-ch:
			want := what + map[string]string{"POST": " the object", "GET": " "}[what]
			if r.err != nil || r.code != http.StatusOK || r.body != want {
				t.Errorf("%s after the outage: %+v, want 200 %q", what, r, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s still waiting after the API server was ready", what)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, a := range auth {
		if a != "Bearer secret" {
			t.Errorf("/readyz asked with Authorization %q, want the requests' credentials", a)
		}
	}
	if o.wait(t.Context()) != nil {
		t.Error("the outage did not end")
	}
}

// A request waits within its context: its deadline ends the wait with an
// error that says why.
func TestOutageWaitEndsWithTheContext(t *testing.T) {
	addr := freeAddr(t)
	rt := fastOutage().wrap(http.DefaultTransport.(*http.Transport).Clone())
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/version", nil)
	start := time.Now()
	_, err := rt.RoundTrip(req)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "waiting for the API server, unreachable since") ||
		!strings.Contains(err.Error(), "connection refused") {
		t.Errorf("err = %v, want the deadline, why it waited and the dial's error", err)
	}
	if d := time.Since(start); d < 250*time.Millisecond || d > 5*time.Second {
		t.Errorf("returned after %v, want at its deadline (300ms)", d)
	}
}

// A request that reached the API server is never sent again: the connection
// broke after it was sent, and the server may have acted on it.
func TestOutageNeverResendsARequestThatWasSent(t *testing.T) {
	var got atomic.Int32
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		conn, _, _ := w.(http.Hijacker).Hijack()
		_ = conn.Close() // the server dies mid-request
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	o := fastOutage()
	rt := o.wrap(http.DefaultTransport.(*http.Transport).Clone())
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+l.Addr().String()+"/api/v1/namespaces/x/pods", strings.NewReader("{}"))
	if _, err := rt.RoundTrip(req); err == nil {
		t.Fatal("no error from a connection closed mid-request")
	}
	if n := got.Load(); n != 1 {
		t.Errorf("the server got the request %d times, want once", n)
	}
	if o.wait(t.Context()) != nil {
		t.Error("a request that was sent began an outage")
	}
}

// Every client built from one config shares the outage, whatever its transport.
func TestLoadWaitsOutOutages(t *testing.T) {
	kc := writeKubeconfig(t, "http://"+freeAddr(t))
	cfg, err := Load(kc, Rate{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.WrapTransport == nil {
		t.Fatal("no transport wrapper")
	}
	a, b := cfg.WrapTransport(http.DefaultTransport).(*outageTransport), cfg.WrapTransport(http.DefaultTransport).(*outageTransport)
	if a == nil || b == nil || a.o != b.o {
		t.Errorf("two clients of one config have outages %p and %p, want one", a.o, b.o)
	}
}
