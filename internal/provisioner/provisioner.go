// Package provisioner keeps the one PavProvisioner a driver serves: read from a
// file, or read and watched through the API so that edits apply without a restart.
// Every version is checked (phase.Check) before it is used; a broken edit makes new
// volumes fail with a readable reason, never stops the driver, and never blocks
// deleting or unstaging existing volumes (they use the last valid version).
package provisioner

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/kube"
	"github.com/pods-as-volumes/pav/internal/phase"
)

// Source gives the current PavProvisioner.
type Source interface {
	// Name is the provisioner's name, which is also the CSI driver name.
	Name() string
	// Get returns the checked provisioner to use, or a gRPC status error:
	// Unavailable while it is not loaded, FailedPrecondition when it is gone or
	// (forNewVolumes) invalid or being deleted. Spec §6: no new provisioning or
	// staging then, but deletion and unstaging (forNewVolumes false) go on, with
	// the last valid spec when the current one is invalid.
	Get(forNewVolumes bool) (*v1alpha1.PavProvisioner, error)
}

// Load reads a PavProvisioner from YAML or JSON, strictly: an unknown field is an
// error naming it.
func Load(data []byte) (*v1alpha1.PavProvisioner, error) {
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("not YAML or JSON: %w", err)
	}
	p := &v1alpha1.PavProvisioner{}
	if err := phase.UnmarshalStrict(j, p); err != nil {
		return nil, fmt.Errorf("not a PavProvisioner: %w", err)
	}
	if p.Kind != "" && p.Kind != v1alpha1.Kind {
		return nil, fmt.Errorf("kind is %q, want %s", p.Kind, v1alpha1.Kind)
	}
	if p.APIVersion != "" && p.APIVersion != v1alpha1.SchemeGroupVersion.String() {
		return nil, fmt.Errorf("apiVersion is %q, want %s", p.APIVersion, v1alpha1.SchemeGroupVersion)
	}
	return p, nil
}

// LoadFile reads and checks a PavProvisioner file.
func LoadFile(path string) (*v1alpha1.PavProvisioner, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p, err := Load(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := phase.Check(p); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// Static is a Source that always gives the same provisioner (--provisioner-file).
type Static struct{ P *v1alpha1.PavProvisioner }

func (s Static) Name() string { return s.P.Name }

func (s Static) Get(bool) (*v1alpha1.PavProvisioner, error) { return s.P, nil }

// Watch is a Source that follows one PavProvisioner object through an informer
// restricted to its name.
//
// An edit that makes the spec invalid refuses new volumes and staging, but never
// blocks deleting or unstaging existing ones (spec §6): for those, Get(false)
// keeps giving the last valid spec. That is the newest valid generation this
// driver saw, or the copy the pav manager keeps in status.lastValidSpec, which
// survives a driver restart.
type Watch struct {
	name   string
	client dynamic.Interface

	mu       sync.RWMutex
	current  *v1alpha1.PavProvisioner // the latest version, if it passed the check
	lastGood *v1alpha1.PavProvisioner // the newest version that passed it (deletion and unstaging)
	err      error                    // why the latest version is not usable, if it is not
	deleting bool                     // the latest version has a deletion timestamp
	synced   bool
}

// NewWatch follows the PavProvisioner called name.
func NewWatch(client dynamic.Interface, name string) *Watch {
	return &Watch{name: name, client: client}
}

func (w *Watch) Name() string { return w.name }

// Start runs the informer until ctx ends and waits for its first sync.
func (w *Watch) Start(ctx context.Context) error {
	inf := kube.NewInformer(w.client, w.client.Resource(v1alpha1.GroupVersionResource), &unstructured.Unstructured{}, 10*time.Minute,
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", w.name).String()
		}, nil)
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.update,
		UpdateFunc: func(_, obj any) { w.update(obj) },
		DeleteFunc: func(any) {
			w.mu.Lock()
			w.current, w.lastGood, w.deleting = nil, nil, false
			w.err = status.Errorf(codes.FailedPrecondition, "PavProvisioner %q was deleted", w.name)
			w.mu.Unlock()
		},
	})
	if err != nil {
		return err
	}
	go inf.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("PavProvisioner informer did not sync")
	}
	w.mu.Lock()
	w.synced = true
	if w.current == nil && w.err == nil {
		w.err = status.Errorf(codes.FailedPrecondition, "PavProvisioner %q does not exist: create it (kubectl apply -f provisioner.yaml)", w.name)
	}
	w.mu.Unlock()
	return nil
}

func (w *Watch) update(obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	p := &v1alpha1.PavProvisioner{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, p); err != nil {
		w.mu.Lock()
		w.current, w.err = nil, status.Errorf(codes.FailedPrecondition, "PavProvisioner %q cannot be read: %v", w.name, err)
		w.mu.Unlock()
		return
	}
	checkErr := phase.Check(p)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.deleting = p.DeletionTimestamp != nil
	if checkErr == nil {
		klog.InfoS("PavProvisioner loaded", "provisioner", w.name, "generation", p.Generation)
		w.current, w.lastGood, w.err = p, p, nil
		return
	}
	w.current = nil
	w.err = status.Errorf(codes.FailedPrecondition, "PavProvisioner %q is invalid: %v", w.name, checkErr)
	if saved := LastValid(p); saved != nil && (w.lastGood == nil || saved.Generation > w.lastGood.Generation) {
		w.lastGood = saved
	} else if w.lastGood != nil {
		// Same spec, newer metadata (a deletion timestamp, for one).
		old := w.lastGood
		w.lastGood = &v1alpha1.PavProvisioner{TypeMeta: p.TypeMeta, ObjectMeta: p.ObjectMeta, Spec: old.Spec}
		w.lastGood.Generation = old.Generation
	}
	if w.lastGood != nil {
		klog.ErrorS(checkErr, "PavProvisioner is invalid: new volumes and staging are refused until it is fixed; deletion and unstaging go on with the last valid spec",
			"provisioner", w.name, "generation", p.Generation, "lastValidGeneration", w.lastGood.Generation)
	} else {
		klog.ErrorS(checkErr, "PavProvisioner is invalid and no valid spec is known: volume operations fail until it is fixed",
			"provisioner", w.name, "generation", p.Generation)
	}
}

// InForce is the provisioner the drivers run with: p itself when it passes the
// check, else LastValid(p) (nil when there is none). The manager deploys the
// sidecars of its features, so that they match what the drivers advertise.
func InForce(p *v1alpha1.PavProvisioner) *v1alpha1.PavProvisioner {
	if phase.Check(p) == nil {
		return p
	}
	return LastValid(p)
}

// LastValid is the spec the pav manager saved in status.lastValidSpec, with the
// object's current metadata, if it (still) passes the check.
func LastValid(p *v1alpha1.PavProvisioner) *v1alpha1.PavProvisioner {
	if p.Status.LastValidSpec == nil {
		return nil
	}
	saved := &v1alpha1.PavProvisioner{TypeMeta: p.TypeMeta, ObjectMeta: p.ObjectMeta, Spec: *p.Status.LastValidSpec}
	saved.Generation = p.Status.LastValidGeneration
	if err := phase.Check(saved); err != nil {
		klog.ErrorS(err, "status.lastValidSpec does not pass the check; ignored", "provisioner", p.Name)
		return nil
	}
	return saved
}

// Get gives the provisioner to use. forNewVolumes (provisioning, staging) needs
// the latest version to be valid and not being deleted; deletion and unstaging
// (forNewVolumes false) get the last valid version.
func (w *Watch) Get(forNewVolumes bool) (*v1alpha1.PavProvisioner, error) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if !w.synced {
		return nil, status.Errorf(codes.Unavailable, "PavProvisioner %q is not loaded yet", w.name)
	}
	if !forNewVolumes {
		if w.lastGood != nil {
			return w.lastGood, nil
		}
		return nil, w.err
	}
	if w.deleting {
		// Before the spec's validity: fixing the spec would not help.
		return nil, status.Errorf(codes.FailedPrecondition, "the PavProvisioner %q is being deleted", w.name)
	}
	if w.err != nil {
		return nil, w.err
	}
	return w.current, nil
}
