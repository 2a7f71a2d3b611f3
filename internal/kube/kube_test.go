package kube_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/reference"

	"github.com/pods-as-volumes/pav/internal/kube"
)

// apiServer answers every request with an empty object of the kind its path
// names, and records the requests.
type apiServer struct {
	mu   sync.Mutex
	seen []string // "METHOD path?query"
}

func (a *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	line := r.Method + " " + r.URL.Path
	if r.URL.RawQuery != "" {
		line += "?" + r.URL.RawQuery
	}
	a.seen = append(a.seen, line)
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.URL.Path == "/version":
		_, _ = io.WriteString(w, `{"major":"1","minor":"36","gitVersion":"v1.36.3"}`)
	case strings.HasSuffix(r.URL.Path, "/log"):
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "last line\n")
	case r.URL.Query().Get("watch") == "true":
		// As the API server streams a list (WatchListClient): the objects,
		// then a bookmark that ends the initial events.
		w.WriteHeader(http.StatusOK)
		if r.URL.Query().Get("sendInitialEvents") == "true" {
			_, _ = io.WriteString(w, `{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns","resourceVersion":"7"}}}
{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"7","annotations":{"k8s.io/initial-events-end":"true"}}}}
`)
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	case strings.HasSuffix(r.URL.Path, "/pods"):
		_, _ = io.WriteString(w, `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[{"metadata":{"name":"p","namespace":"ns"}}]}`)
	default:
		_, _ = io.WriteString(w, `{"metadata":{"name":"x"}}`)
	}
}

func (a *apiServer) requests() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.seen...)
}

func newClient(t *testing.T) (kube.Interface, *apiServer) {
	t.Helper()
	api := &apiServer{}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	c, err := kube.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return c, api
}

// TestPaths: every call reaches the path client-go's clientset would use.
func TestPaths(t *testing.T) {
	ctx := context.Background()
	get := metav1.GetOptions{}
	for _, tc := range []struct {
		name string
		call func(kube.Interface) error
		want string
	}{
		{"pod get", func(c kube.Interface) error { _, err := c.Pods("ns").Get(ctx, "p", get); return err },
			"GET /api/v1/namespaces/ns/pods/p"},
		{"pod create", func(c kube.Interface) error {
			_, err := c.Pods("ns").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}}, metav1.CreateOptions{})
			return err
		}, "POST /api/v1/namespaces/ns/pods"},
		{"pod delete", func(c kube.Interface) error {
			return c.Pods("ns").Delete(ctx, "p", metav1.DeleteOptions{})
		}, "DELETE /api/v1/namespaces/ns/pods/p"},
		{"pods of all namespaces by label", func(c kube.Interface) error {
			_, err := c.Pods("").List(ctx, metav1.ListOptions{LabelSelector: "a=b"})
			return err
		}, "GET /api/v1/pods?labelSelector=a%3Db"},
		{"pod log tail", func(c kube.Interface) error {
			lines := int64(20)
			b, err := c.Pods("ns").GetLogs("p", &corev1.PodLogOptions{Container: "main", TailLines: &lines}).DoRaw(ctx)
			if err == nil && string(b) != "last line\n" {
				t.Errorf("log = %q", b)
			}
			return err
		}, "GET /api/v1/namespaces/ns/pods/p/log?container=main&tailLines=20"},
		{"pv", func(c kube.Interface) error { _, err := c.PersistentVolumes().Get(ctx, "pv", get); return err },
			"GET /api/v1/persistentvolumes/pv"},
		{"pvc", func(c kube.Interface) error { _, err := c.PersistentVolumeClaims("ns").Get(ctx, "c", get); return err },
			"GET /api/v1/namespaces/ns/persistentvolumeclaims/c"},
		{"node", func(c kube.Interface) error { _, err := c.Nodes().Get(ctx, "n", get); return err },
			"GET /api/v1/nodes/n"},
		{"storage class", func(c kube.Interface) error { _, err := c.StorageClasses().Get(ctx, "sc", get); return err },
			"GET /apis/storage.k8s.io/v1/storageclasses/sc"},
		{"volume attributes class", func(c kube.Interface) error { _, err := c.VolumeAttributesClasses().Get(ctx, "fast", get); return err },
			"GET /apis/storage.k8s.io/v1/volumeattributesclasses/fast"},
		{"event create", func(c kube.Interface) error {
			_, err := c.EventSink().Create(&corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "e", Namespace: "ns"}})
			return err
		}, "POST /api/v1/namespaces/ns/events"},
		{"event update", func(c kube.Interface) error {
			_, err := c.EventSink().Update(&corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "e", Namespace: "ns"}})
			return err
		}, "PUT /api/v1/namespaces/ns/events/e"},
		{"event patch", func(c kube.Interface) error {
			_, err := c.EventSink().Patch(&corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "e", Namespace: "ns"}}, []byte(`{"count":2}`))
			return err
		}, "PATCH /api/v1/namespaces/ns/events/e"},
		{"version", func(c kube.Interface) error {
			v, err := c.ServerVersion(ctx)
			if err == nil && v.GitVersion != "v1.36.3" {
				t.Errorf("version = %+v", v)
			}
			return err
		}, "GET /version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, api := newClient(t)
			if err := tc.call(c); err != nil {
				t.Fatal(err)
			}
			if got := api.requests(); len(got) != 1 || got[0] != tc.want {
				t.Errorf("requests = %q, want [%q]", got, tc.want)
			}
		})
	}
}

// TestInformerListsWithTweak: the informer lists (as a watch-list stream, as
// against a real API server) and watches with the tweaked options, and fills
// its cache.
func TestInformerListsWithTweak(t *testing.T) {
	c, api := newClient(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inf := kube.NewInformer(c, c.Pods(""), &corev1.Pod{}, 0,
		func(o *metav1.ListOptions) { o.LabelSelector = "app=x" }, nil)
	go inf.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("not synced")
	}
	if _, ok, _ := inf.GetIndexer().GetByKey("ns/p"); !ok {
		t.Errorf("cache lacks ns/p: %v", inf.GetIndexer().ListKeys())
	}
	if byNS, _ := inf.GetIndexer().ByIndex(cache.NamespaceIndex, "ns"); len(byNS) != 1 {
		t.Errorf("namespace index has %d pods in ns, want 1", len(byNS))
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		var watch bool
		for _, r := range api.requests() {
			if !strings.HasPrefix(r, "GET /api/v1/pods?") || !strings.Contains(r, "labelSelector=app%3Dx") {
				t.Fatalf("request %q: want every one on pods with labelSelector=app=x", r)
			}
			watch = watch || strings.Contains(r, "watch=true")
		}
		if watch {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("requests %q: want a watch", api.requests())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestEventReferences: an event recorder makes its reference to the object
// with Scheme; a kind it does not know drops the event. The driver records
// events on pods and on PVCs and PVs (as ObjectReferences).
func TestEventReferences(t *testing.T) {
	for _, obj := range []runtime.Object{
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}},
		&corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Name: "c", Namespace: "ns"},
	} {
		ref, err := reference.GetReference(kube.Scheme, obj)
		if err != nil || ref.Kind == "" {
			t.Errorf("%T: reference %+v, %v", obj, ref, err)
		}
	}
}

// TestUnwrap: an informer's object, or the last state a missed deletion
// carries, as the type the handler wants.
func TestUnwrap(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}}
	for _, tc := range []struct {
		name string
		obj  any
		ok   bool
	}{
		{"object", pod, true},
		{"missed deletion", cache.DeletedFinalStateUnknown{Key: "ns/p", Obj: pod}, true},
		{"another type", &corev1.Node{}, false},
		{"missed deletion of another type", cache.DeletedFinalStateUnknown{Key: "n", Obj: &corev1.Node{}}, false},
		{"nil", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := kube.Unwrap[*corev1.Pod](tc.obj)
			if ok != tc.ok || (ok && got != pod) {
				t.Errorf("Unwrap = %v, %v; want the pod: %v", got, ok, tc.ok)
			}
		})
	}
}
