//go:build e2e

package e2e

// A namespace deleted under the volumes whose pods run in it (issue 36, item 2): the
// encrypted-fs example in annotation mode, whose deletion pod runs in the claim's namespace
// and needs the underlying claim there.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/controllerserver"
)

// TestEncryptedFSNamespaceGone: a namespace holding encrypted-fs claims (annotation mode)
// and their underlying loop-block claim is deleted, so their deletion pods can never be
// created there.
//
//   - With whenNamespaceGone: Retry (the provisioner patched for the test), each volume is
//     reported: its PavVolume's reason DeletionNamespaceGone (also in `kubectl get pavvol`)
//     with a message that names the namespace, the field and the way out, and the events on
//     its PV (pav's DeletionNamespaceGone, external-provisioner's VolumeFailedDelete); its PV
//     stays Released. Then the ways out: an administrator's annotation on one PavVolume, the
//     provisioner's Forget for the other; each is forgotten, with a VolumeForgotten event
//     saying who decided.
//   - As shipped (Forget), a volume is forgotten at once.
//
// Nothing of the volumes is left (PVs, PavVolumes, pods), no deletion pod ever ran, and the
// underlying volumes, kept by a Retain class, still hold every encrypted directory with its
// file: nothing but the namespace's deletion (and the underlying class's policy) decided
// what happened to the data.
func TestEncryptedFSNamespaceGone(t *testing.T) {
	inLane(t, laneLoopBlock)
	start := time.Now()
	waitExample(t, "loop-block")
	waitExample(t, "encrypted-fs")
	if p, err := getProvisioner(bgCtx(), "encrypted-fs"); err != nil {
		t.Fatal(err)
	} else if w, _ := p.Spec.VolumeDeletion.Data.(map[string]any)["whenNamespaceGone"].(string); w != string(v1alpha1.NamespaceGoneForget) {
		t.Fatalf("examples/encrypted-fs says whenNamespaceGone %q, want Forget", w)
	}
	e := newEnv(t)
	// The underlying volumes stay after their claims (Retain), so that what is left on
	// them can be looked at once their namespace is gone.
	retain := e.newSC("loop-block", nil, storagev1.VolumeBindingWaitForFirstConsumer, hostNode())
	retain.ReclaimPolicy = ptr(corev1.PersistentVolumeReclaimRetain)
	lb := e.createSC(retain)
	efs := e.exampleSC("encrypted-fs", nil, storagev1.VolumeBindingImmediate)

	// 1. Retry: the report, and the ways out.
	setWhenNamespaceGone(t, v1alpha1.NamespaceGoneRetry)
	gone := e.namespace("gone")
	under, pvs, secret := gone.encryptedFS(lb, efs, "a", "b")
	gone.deleteNamespace()
	for _, c := range []string{"a", "b"} {
		pv := pvs[c]
		v := waitRecord(e, pv.Name, func(v *v1alpha1.PavVolume) bool { return v.Status.Reason == v1alpha1.ReasonDeletionNamespaceGone })
		for _, want := range []string{
			fmt.Sprintf("volume %s cannot be deleted: its deletion pod cannot be created in namespace %q, which ", pv.Name, gone.ns),
			"from spec.volumeDeletion.podTemplate.metadata.namespace of PavProvisioner encrypted-fs",
			"as spec.volumeDeletion.whenNamespaceGone says (Retry)",
			"kubectl annotate pavvolume " + pv.Name + " pav.albertofaria.github.io/when-namespace-gone=Forget",
		} {
			if !strings.Contains(v.Status.Message, want) {
				t.Errorf("PavVolume %s: message %q lacks %q", pv.Name, v.Status.Message, want)
			}
		}
		if v.Status.Phase != v1alpha1.VolumeDeleting {
			t.Errorf("PavVolume %s is %s, want Deleting", pv.Name, v.Status.Phase)
		}
		if got := pavvolColumn(t, pv.Name, "REASON"); got != v1alpha1.ReasonDeletionNamespaceGone {
			t.Errorf("kubectl get pavvol %s: REASON %q, want %s", pv.Name, got, v1alpha1.ReasonDeletionNamespaceGone)
		}
		e.waitPVEvent(pv.Name, controllerserver.EventDeletionNamespaceGone, corev1.EventTypeWarning, fmt.Sprintf("namespace %q", gone.ns), "kubectl annotate pavvolume "+pv.Name)
		e.waitPVEvent(pv.Name, "VolumeFailedDelete", corev1.EventTypeWarning, "FailedPrecondition", "kubectl annotate pavvolume "+pv.Name)
		if got, err := client.CoreV1().PersistentVolumes().Get(e.ctx, pv.Name, metav1.GetOptions{}); err != nil || got.Status.Phase != corev1.VolumeReleased {
			t.Fatalf("PV %s: %v, %v; want it kept, Released", pv.Name, phaseOf(got), err)
		}
	}
	// The ways out: an administrator forgets one volume; the provisioner, as shipped,
	// forgets the other (and any other such volume).
	forgotten := time.Now()
	kubectl(t, "annotate", "pavvolume", pvs["a"].Name, v1alpha1.AnnotationWhenNamespaceGone+"="+string(v1alpha1.NamespaceGoneForget))
	setWhenNamespaceGone(t, v1alpha1.NamespaceGoneForget)
	// external-provisioner retries with backoff (at most 5 minutes apart).
	for c, by := range map[string]string{"a": "the PavVolume's annotation " + v1alpha1.AnnotationWhenNamespaceGone, "b": "spec.volumeDeletion.whenNamespaceGone"} {
		pv := pvs[c]
		e.pollFor("PV "+pv.Name+" forgotten", 6*time.Minute, func() (bool, error) {
			_, err := client.CoreV1().PersistentVolumes().Get(e.ctx, pv.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		e.waitPVEvent(pv.Name, controllerserver.EventVolumeForgotten, corev1.EventTypeNormal, by+" says Forget", "pav deleted nothing")
	}
	t.Logf("both volumes forgotten within %v of their ways out", time.Since(forgotten).Round(time.Second))
	e.assertNothingLeft(pvs)
	e.waitNamespaceGone(gone.ns)

	// 2. As shipped (Forget): forgotten at the first attempt.
	gone2 := e.namespace("gone")
	under2, pvs2, secret2 := gone2.encryptedFS(lb, efs, "c")
	deleted := time.Now()
	gone2.deleteNamespace()
	e.pollFor("PV "+pvs2["c"].Name+" forgotten", 2*time.Minute, func() (bool, error) {
		_, err := client.CoreV1().PersistentVolumes().Get(e.ctx, pvs2["c"].Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	t.Logf("the volume was forgotten %v after its namespace's deletion", time.Since(deleted).Round(time.Second))
	e.waitPVEvent(pvs2["c"].Name, controllerserver.EventVolumeForgotten, corev1.EventTypeNormal,
		fmt.Sprintf("cannot run in namespace %q", gone2.ns), "spec.volumeDeletion.whenNamespaceGone says Forget")
	e.assertNothingLeft(pvs2)
	e.waitNamespaceGone(gone2.ns)

	// What the namespaces' deletion left on the underlying volumes: every encrypted
	// directory, with its file, as it was.
	e.inspectRetained(under, secret, pvs["a"].Spec.CSI.VolumeHandle, pvs["b"].Spec.CSI.VolumeHandle)
	e.inspectRetained(under2, secret2, pvs2["c"].Spec.CSI.VolumeHandle)
	t.Logf("TestEncryptedFSNamespaceGone took %v", time.Since(start).Round(time.Second))
}

// setWhenNamespaceGone sets the encrypted-fs example's whenNamespaceGone (restored to the
// example's Forget when the test ends) and waits until the manager has seen it.
func setWhenNamespaceGone(t *testing.T, w v1alpha1.WhenNamespaceGone) {
	t.Helper()
	patch := func(w v1alpha1.WhenNamespaceGone) error {
		_, err := dyn.Resource(v1alpha1.GroupVersionResource).Patch(bgCtx(), "encrypted-fs", types.MergePatchType,
			[]byte(fmt.Sprintf(`{"spec":{"volumeDeletion":{"whenNamespaceGone":%q}}}`, w)), metav1.PatchOptions{})
		return err
	}
	if err := patch(w); err != nil {
		t.Fatal(err)
	}
	if w != v1alpha1.NamespaceGoneForget {
		t.Cleanup(func() { _ = patch(v1alpha1.NamespaceGoneForget) })
	}
	ctx, cancel := context.WithTimeout(bgCtx(), time.Minute)
	defer cancel()
	for {
		p, err := getProvisioner(ctx, "encrypted-fs")
		if err == nil && p.Status.ObservedGeneration >= p.Generation {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the manager did not see the change of whenNamespaceGone: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	// The controller plugin watches the same object; give its watch a moment.
	time.Sleep(2 * time.Second)
}

// namespace makes another namespace for the test (deleted with it, if still there), as an
// env sharing e's context.
func (e *env) namespace(prefix string) *env {
	e.t.Helper()
	o := &env{t: e.t, ctx: e.ctx, ns: e.ns + "-" + prefix + "-" + strings.ToLower(rand.String(4))}
	if _, err := client.CoreV1().Namespaces().Create(e.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.ns}}, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = client.CoreV1().Namespaces().Delete(context.Background(), o.ns, metav1.DeleteOptions{}) })
	o.poll("default ServiceAccount of "+o.ns, func() (bool, error) {
		_, err := client.CoreV1().ServiceAccounts(o.ns).Get(o.ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	return o
}

func (e *env) deleteNamespace() {
	e.t.Helper()
	if err := client.CoreV1().Namespaces().Delete(e.ctx, e.ns, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) waitNamespaceGone(ns string) {
	e.t.Helper()
	e.poll("namespace "+ns+" gone", func() (bool, error) {
		_, err := client.CoreV1().Namespaces().Get(e.ctx, ns, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

// encryptedFS makes, in e's namespace, a passphrase, an underlying loop-block claim and
// encrypted-fs claims over it (annotation mode), writes a file through each, waits until
// all are unstaged, and returns the underlying PV, the encrypted PVs by claim, and the
// file's (secret) content.
func (e *env) encryptedFS(lb, efs string, claims ...string) (*corev1.PersistentVolume, map[string]*corev1.PersistentVolume, string) {
	e.t.Helper()
	e.secret("passphrase", map[string]string{"passphrase": "correct horse " + e.ns})
	e.claim("ciphertext", lb, claimOpts{size: "64Mi"})
	secret := "pav-plaintext-" + rand.String(12)
	pvs := map[string]*corev1.PersistentVolume{}
	for _, c := range claims {
		e.annotatedClaim(c, efs, claimOpts{size: "16Mi"},
			map[string]string{"encrypted-fs/underlyingClaimName": "ciphertext", "encrypted-fs/secretName": "passphrase"})
	}
	for _, c := range claims {
		pvs[c] = e.waitBound(c)
		if out := e.runClient("writer-"+c, "echo "+secret+" > /data/"+c+"/diary.txt && cat /data/"+c+"/diary.txt", c); out != secret+"\n" {
			e.t.Fatalf("writer of %s read %q", c, out)
		}
		e.deletePod("writer-" + c)
		e.waitUnstaged("encrypted-fs", pvs[c].Spec.CSI.VolumeHandle)
	}
	under := e.waitBound("ciphertext")
	e.waitUnstaged("loop-block", under.Spec.CSI.VolumeHandle)
	return under, pvs, secret
}

// waitRecord waits until the PavVolume of a volume satisfies cond, and returns it.
func waitRecord(e *env, name string, cond func(*v1alpha1.PavVolume) bool) *v1alpha1.PavVolume {
	e.t.Helper()
	var v *v1alpha1.PavVolume
	e.pollFor("PavVolume "+name, 2*time.Minute, func() (bool, error) {
		var err error
		v, err = record(e.ctx, name)
		return err == nil && v != nil && cond(v), err
	})
	return v
}

// pavvolColumn is one column of `kubectl get pavvol NAME`, as a user reads it.
func pavvolColumn(t *testing.T, name, column string) string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(kubectl(t, "get", "pavvol", name)), "\n")
	if len(lines) != 2 {
		t.Fatalf("kubectl get pavvol %s:\n%s", name, strings.Join(lines, "\n"))
	}
	header, row := strings.Fields(lines[0]), strings.Fields(lines[1])
	i := slices.Index(header, column)
	if i < 0 || len(row) != len(header) {
		t.Fatalf("kubectl get pavvol %s has no column %s (or an empty one):\n%s", name, column, strings.Join(lines, "\n"))
	}
	return row[i]
}

// waitPVEvent waits for an event on a PV (in the default namespace, as events on
// cluster-scoped objects are) of a reason and type whose message holds every substring.
func (e *env) waitPVEvent(pv, reason, eventtype string, substrings ...string) {
	e.t.Helper()
	e.pollFor(fmt.Sprintf("%s event %s on PV %s containing %q", eventtype, reason, pv, substrings), 2*time.Minute, func() (bool, error) {
		evs, err := client.CoreV1().Events(metav1.NamespaceDefault).List(e.ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=PersistentVolume,involvedObject.name=" + pv})
		if err != nil {
			return false, err
		}
		for _, ev := range evs.Items {
			if ev.Reason != reason || ev.Type != eventtype {
				continue
			}
			ok := true
			for _, s := range substrings {
				ok = ok && strings.Contains(ev.Message, s)
			}
			if ok {
				return true, nil
			}
		}
		return false, nil
	})
}

// assertNothingLeft: the volumes' PVs and PavVolumes are gone, and no encrypted-fs pod of
// theirs exists; none of their deletion pods was ever created (the data check shows it).
func (e *env) assertNothingLeft(pvs map[string]*corev1.PersistentVolume) {
	e.t.Helper()
	for _, pv := range pvs {
		if _, err := client.CoreV1().PersistentVolumes().Get(e.ctx, pv.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			e.t.Errorf("PV %s left: %v", pv.Name, err)
		}
		if v, err := record(e.ctx, pv.Name); v != nil || err != nil {
			e.t.Errorf("PavVolume %s left: %+v, %v", pv.Name, v, err)
		}
		h := pv.Spec.CSI.VolumeHandle
		for _, ph := range v1alpha1.Phases {
			for _, key := range []string{h, controllerserver.DeletionKey(h)} {
				if ps := pavPods("encrypted-fs", string(ph), key); len(ps) > 0 {
					e.t.Errorf("%s pods of %s left: %s/%s", ph, pv.Name, ps[0].Namespace, ps[0].Name)
				}
			}
		}
	}
}

// inspectRetained looks at what is on an underlying volume kept by its Retain class once
// its namespace went: its backing file on the node, then (bound again to a claim of e's
// namespace) each encrypted directory: gocryptfs.conf, gocryptfs.diriv and the one
// encrypted file, without the plaintext. Then the volume is deleted for good.
func (e *env) inspectRetained(under *corev1.PersistentVolume, secret string, handles ...string) {
	e.t.Helper()
	e.poll("underlying PV "+under.Name+" Released", func() (bool, error) {
		pv, err := client.CoreV1().PersistentVolumes().Get(e.ctx, under.Name, metav1.GetOptions{})
		return err == nil && pv.Status.Phase == corev1.VolumeReleased, err
	})
	if _, err := os.Stat(filepath.Join(loopBlockDir, under.Spec.CSI.VolumeHandle+".img")); err != nil {
		e.t.Fatalf("the underlying volume's backing file: %v", err)
	}
	// Released → Available, then bound by name to a new claim.
	if _, err := client.CoreV1().PersistentVolumes().Patch(e.ctx, under.Name, types.MergePatchType, []byte(`{"spec":{"claimRef":null}}`), metav1.PatchOptions{}); err != nil {
		e.t.Fatal(err)
	}
	claim := "kept-" + strings.ToLower(rand.String(4))
	e.claim(claim, under.Spec.StorageClassName, claimOpts{size: "64Mi", volume: under.Name})
	e.waitBound(claim)
	script := ""
	for _, h := range handles {
		script += fmt.Sprintf("cd /data/%s/%s && ls && echo files: $(ls | wc -l) && ! grep -r -l %s . && cd / && ", claim, h, secret)
	}
	out := e.runClient("inspect-"+claim, script+"true", claim)
	if got := strings.Count(out, "gocryptfs.conf\n"); got != len(handles) || strings.Count(out, "files: 3\n") != len(handles) {
		e.t.Fatalf("the underlying volume holds:\n%s\nwant, for each of %d encrypted directories, gocryptfs.conf, gocryptfs.diriv and the encrypted file", out, len(handles))
	}
	e.deletePod("inspect-" + claim)
	e.deleteClaim(claim)
	e.poll("underlying PV "+under.Name+" Released again", func() (bool, error) {
		pv, err := client.CoreV1().PersistentVolumes().Get(e.ctx, under.Name, metav1.GetOptions{})
		return err == nil && pv.Status.Phase == corev1.VolumeReleased, err
	})
	// Done with it: Delete, and loop-block's deletion pod removes it.
	if _, err := client.CoreV1().PersistentVolumes().Patch(e.ctx, under.Name, types.MergePatchType,
		[]byte(`{"spec":{"persistentVolumeReclaimPolicy":"Delete"}}`), metav1.PatchOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.waitPVGone(under.Name)
}

func phaseOf(pv *corev1.PersistentVolume) corev1.PersistentVolumePhase {
	if pv == nil {
		return ""
	}
	return pv.Status.Phase
}
