package nodeserver

import (
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/pods-as-volumes/pav/internal/volume"
)

func TestMain(m *testing.M) {
	// The fake clientset's watchers have fixed-size channels and panic when
	// one fills up; the cost test fills the cluster with objects at once.
	watch.DefaultChanSize = 10000
	os.Exit(m.Run())
}

// add puts objects in the fake cluster.
func (e *env) add(objs ...runtime.Object) {
	e.t.Helper()
	for _, o := range objs {
		if err := e.client.Tracker().Add(o); err != nil {
			e.t.Fatal(err)
		}
	}
}

// dynamicVolume makes the PV and bound PVC of a volume pav created, and
// returns the volume context CreateVolume gave it (which names the PV).
func (e *env) dynamicVolume(handle string, mode corev1.PersistentVolumeMode) map[string]string {
	e.t.Helper()
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "claim-" + handle, Namespace: "apps", UID: types.UID("uid-" + handle)},
		Spec:       corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, VolumeMode: &mode, VolumeName: "pv-" + handle},
	}
	vc := volume.Context(map[string]string{"color": "blue"}, 1<<20, "pv-"+handle)
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-" + handle},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(1<<20, resource.BinarySI)},
			AccessModes: pvc.Spec.AccessModes, VolumeMode: &mode,
			ClaimRef: &corev1.ObjectReference{Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: "test", VolumeHandle: handle, VolumeAttributes: vc,
			}},
		},
	}
	e.add(pvc, pv)
	return vc
}

// staticVolume makes a static PV of handle, a PVC bound to it and a pod on
// nodeName that uses it (kubelet stages a volume for a pod scheduled there).
func (e *env) staticVolume(handle string, access corev1.PersistentVolumeAccessMode, nodeName string) {
	e.t.Helper()
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "static-pv-" + handle},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(1<<20, resource.BinarySI)},
			AccessModes: []corev1.PersistentVolumeAccessMode{access},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: "test", VolumeHandle: handle,
			}},
		},
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "static-" + handle, Namespace: "apps"},
		Spec: corev1.PersistentVolumeClaimSpec{VolumeName: pv.Name}}
	e.add(pv, pvc, userPod("user-"+handle, nodeName, pvc.Name))
}

func userPod(name, nodeName string, claims ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "apps"}, Spec: corev1.PodSpec{NodeName: nodeName}}
	for _, c := range claims {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: c, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c}}})
	}
	return p
}

// waitEvent waits for an event whose text holds every substring, and
// returns it; other events are dropped.
func (e *env) waitEvent(within time.Duration, substrings ...string) string {
	e.t.Helper()
	deadline := time.After(within)
	for {
		select {
		case ev := <-e.events.Events:
			ok := true
			for _, s := range substrings {
				ok = ok && strings.Contains(ev, s)
			}
			if ok {
				return ev
			}
		case <-deadline:
			e.t.Fatalf("no event containing %q within %v", substrings, within)
		}
	}
}

// drainEvents returns the events recorded so far.
func (e *env) drainEvents() []string {
	var out []string
	for {
		select {
		case ev := <-e.events.Events:
			out = append(out, ev)
		default:
			return out
		}
	}
}

func mustNotHave(t *testing.T, events []string, s string) {
	t.Helper()
	for _, ev := range events {
		if strings.Contains(ev, s) {
			t.Fatalf("unexpected event %q", ev)
		}
	}
}
