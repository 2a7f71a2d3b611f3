// Package provisioner keeps the one PavProvisioner a driver serves: read from a
// file, or read and watched through the API so that edits apply without a restart.
// Every version is checked (phase.Check) before it is used; a broken edit keeps no
// volume operation from failing with a readable reason, and never stops the driver.
package provisioner

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/phase"
)

// Source gives the current PavProvisioner.
type Source interface {
	// Name is the provisioner's name, which is also the CSI driver name.
	Name() string
	// Get returns the current, checked provisioner, or a gRPC status error:
	// Unavailable while it is not loaded, FailedPrecondition when it is invalid or
	// gone. forNewVolumes also refuses a provisioner that is being deleted (spec §6:
	// no new provisioning or staging, but deletion and unstaging go on).
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
type Watch struct {
	name         string
	client       dynamic.Interface
	reportStatus bool

	mu      sync.RWMutex
	current *v1alpha1.PavProvisioner // last version that passed the check
	err     error                    // why the latest version is not usable, if it is not
	synced  bool
}

// NewWatch follows the PavProvisioner called name. With reportStatus (one writer:
// the controller plugin) the check's outcome is written to the object's
// status.conditions as condition "Valid".
func NewWatch(client dynamic.Interface, name string, reportStatus bool) *Watch {
	return &Watch{name: name, client: client, reportStatus: reportStatus}
}

func (w *Watch) Name() string { return w.name }

// Start runs the informer until ctx ends and waits for its first sync.
func (w *Watch) Start(ctx context.Context) error {
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(w.client, 10*time.Minute, metav1.NamespaceAll,
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", w.name).String()
		})
	inf := factory.ForResource(v1alpha1.GroupVersionResource).Informer()
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.update(ctx, obj) },
		UpdateFunc: func(_, obj any) { w.update(ctx, obj) },
		DeleteFunc: func(any) {
			w.set(nil, status.Errorf(codes.FailedPrecondition, "PavProvisioner %q was deleted", w.name))
		},
	})
	if err != nil {
		return err
	}
	factory.Start(ctx.Done())
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

func (w *Watch) update(ctx context.Context, obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	p := &v1alpha1.PavProvisioner{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, p); err != nil {
		w.set(nil, status.Errorf(codes.FailedPrecondition, "PavProvisioner %q cannot be read: %v", w.name, err))
		return
	}
	checkErr := phase.Check(p)
	if checkErr != nil {
		klog.ErrorS(checkErr, "PavProvisioner is invalid; volume operations will fail until it is fixed", "provisioner", w.name, "generation", p.Generation)
		// Keep nothing of a broken version: running volume operations on an older
		// version the user has replaced would be surprising.
		w.set(nil, status.Errorf(codes.FailedPrecondition, "PavProvisioner %q is invalid: %v", w.name, checkErr))
	} else {
		klog.InfoS("PavProvisioner loaded", "provisioner", w.name, "generation", p.Generation)
		w.set(p, nil)
	}
	if w.reportStatus {
		// In the handler, not a goroutine: events arrive in order, so the last
		// version checked is the status that stays.
		w.writeStatus(ctx, p, checkErr)
	}
}

func (w *Watch) set(p *v1alpha1.PavProvisioner, err error) {
	w.mu.Lock()
	w.current, w.err = p, err
	w.mu.Unlock()
}

func (w *Watch) Get(forNewVolumes bool) (*v1alpha1.PavProvisioner, error) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if !w.synced {
		return nil, status.Errorf(codes.Unavailable, "PavProvisioner %q is not loaded yet", w.name)
	}
	if w.err != nil {
		return nil, w.err
	}
	if forNewVolumes && w.current.DeletionTimestamp != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "the PavProvisioner %q is being deleted", w.name)
	}
	return w.current, nil
}

// writeStatus records the check's outcome as condition Valid, so `kubectl get pav`
// shows a broken provisioner without reading driver logs.
func (w *Watch) writeStatus(ctx context.Context, p *v1alpha1.PavProvisioner, checkErr error) {
	cond := metav1.Condition{Type: "Valid", Status: metav1.ConditionTrue, Reason: "Checked",
		Message: "literal values and template syntax are valid", ObservedGeneration: p.Generation}
	if checkErr != nil {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "Invalid", checkErr.Error()
	}
	old := meta.FindStatusCondition(p.Status.Conditions, "Valid")
	if old != nil && old.Status == cond.Status && old.Message == cond.Message && old.ObservedGeneration == cond.ObservedGeneration {
		return
	}
	conds := append([]metav1.Condition(nil), p.Status.Conditions...)
	meta.SetStatusCondition(&conds, cond)
	st := v1alpha1.PavProvisionerStatus{ObservedGeneration: p.Generation, Conditions: conds}
	// A merge patch of the status subresource touches nothing else and needs no
	// resourceVersion: the newest check always wins.
	patch, err := json.Marshal(map[string]any{"status": st})
	if err != nil {
		klog.ErrorS(err, "cannot encode status")
		return
	}
	if _, err := w.client.Resource(v1alpha1.GroupVersionResource).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		klog.V(2).InfoS("could not update PavProvisioner status", "provisioner", p.Name, "err", err)
	}
}
