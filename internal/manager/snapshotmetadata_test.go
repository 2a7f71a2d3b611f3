package manager

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/yaml"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

// cbtProvisioner takes snapshots and lists their blocks.
func cbtProvisioner(name, uid string, generation int64) *unstructured.Unstructured {
	u := provisioner(name, uid, generation)
	spec := u.Object["spec"].(map[string]any)
	pod := map[string]any{"podTemplate": map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "c", "image": "busybox"}}}}}
	spec["provisioningModes"] = []any{"Dynamic"}
	spec["snapshotCreation"] = pod
	spec["snapshotMetadata"] = pod
	return u
}

// withSnapshotMetadataCRD makes the fake dynamic API serve
// SnapshotMetadataServices (server-side apply as create-or-merge), or,
// served false, answer for the resource as an API server without the CRD.
func (f *fixture) withSnapshotMetadataCRD(served bool) {
	f.dyn.PrependReactor("*", SnapshotMetadataServiceGVR.Resource, func(action k8stesting.Action) (bool, runtime.Object, error) {
		if !served {
			return true, nil, apierrors.NewNotFound(SnapshotMetadataServiceGVR.GroupResource(), "")
		}
		pa, ok := action.(k8stesting.PatchAction)
		if !ok || pa.GetPatchType() != types.ApplyPatchType {
			return false, nil, nil
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(pa.GetPatch(), &u.Object); err != nil {
			return true, nil, err
		}
		tracker := f.dyn.Tracker()
		if _, err := tracker.Get(SnapshotMetadataServiceGVR, "", pa.GetName()); apierrors.IsNotFound(err) {
			u.SetUID(types.UID("sms-" + pa.GetName()))
			return true, u, tracker.Create(SnapshotMetadataServiceGVR, u, "")
		}
		return true, u, tracker.Update(SnapshotMetadataServiceGVR, u, "")
	})
}

func (f *fixture) sms(name string) *unstructured.Unstructured {
	f.t.Helper()
	u, err := f.dyn.Resource(SnapshotMetadataServiceGVR).Get(f.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return u
}

func (f *fixture) tlsSecret(name string) *corev1.Secret {
	f.t.Helper()
	s, err := f.kube.CoreV1().Secrets(ns).Get(f.ctx, SnapshotMetadataSecretName(name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

func TestRenderSnapshotMetadata(t *testing.T) {
	p, err := toProvisioner(cbtProvisioner("cbt", "uid-1", 1))
	if err != nil {
		t.Fatal(err)
	}
	o, err := Render(p, "pav", Settings{Images: Images{CSISnapshotMetadata: "mirror/csi-snapshot-metadata:v1.1.0"},
		Resources: Resources{CSISnapshotMetadata: &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("20m")}}}})
	if err != nil {
		t.Fatal(err)
	}
	spec := o.Controller.Spec.Template.Spec
	c := container(&spec, containerSnapshotMetadata)
	if c == nil {
		t.Fatal("no csi-snapshot-metadata container")
	}
	for _, arg := range []string{"--csi-address=/csi/csi.sock", "--tls-cert=/etc/csi-snapshot-metadata/tls/tls.crt",
		"--tls-key=/etc/csi-snapshot-metadata/tls/tls.key", "--port=50051", "--http-endpoint=:8085",
		"--audience=pav.albertofaria.github.io/snapshot-metadata/cbt"} {
		if !slices.Contains(c.Args, arg) {
			t.Errorf("args %v lack %s", c.Args, arg)
		}
	}
	if c.Image != "mirror/csi-snapshot-metadata:v1.1.0" || c.Resources.Requests.Cpu().String() != "20m" {
		t.Errorf("image %s, resources %v: the settings do not apply", c.Image, c.Resources)
	}
	// Its ports are its own: the driver has 8080, the other sidecars 808x.
	seen := map[int32]string{}
	for _, ct := range spec.Containers {
		for _, port := range ct.Ports {
			if other, dup := seen[port.ContainerPort]; dup {
				t.Errorf("port %d of %s is %s's too", port.ContainerPort, ct.Name, other)
			}
			seen[port.ContainerPort] = ct.Name
		}
	}
	var tls *corev1.Volume
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == snapshotMetadataTLSVolume {
			tls = &spec.Volumes[i]
		}
	}
	if tls == nil || tls.Secret.SecretName != "pav-cbt-snapshot-metadata-tls" || len(tls.Secret.Items) != 2 {
		t.Errorf("TLS volume %+v: want the Secret's tls.crt and tls.key only (never the CA's key)", tls)
	}
	svc := o.SnapshotMetadata
	if svc == nil || svc.Name != "pav-cbt-snapshot-metadata" || svc.Spec.Selector[labelInstance] != "cbt" ||
		svc.Spec.Ports[0].Port != 6443 || svc.Spec.Ports[0].TargetPort.StrVal != "snapshot-meta" || svc.Annotations[AnnotationApplied] == "" {
		t.Errorf("Service %+v", svc)
	}
	if o.Controller.Spec.Template.Annotations[AnnotationFeatures] != "snapshots,snapshotmetadata" {
		t.Errorf("features %q", o.Controller.Spec.Template.Annotations[AnnotationFeatures])
	}

	// Without spec.snapshotMetadata: none of it.
	p, _ = toProvisioner(provisioner("plain", "uid-2", 1))
	o, err = Render(p, "pav", Settings{})
	if err != nil {
		t.Fatal(err)
	}
	if container(&o.Controller.Spec.Template.Spec, containerSnapshotMetadata) != nil || o.SnapshotMetadata != nil {
		t.Error("a provisioner without spec.snapshotMetadata gets the sidecar")
	}
}

func TestReconcileSnapshotMetadata(t *testing.T) {
	f := newFixture(t, Settings{})
	f.withSnapshotMetadataCRD(true)
	f.create(cbtProvisioner("cbt", "uid-1", 1))
	mustReconcile(t, f, "cbt")
	wantWrites(t, f,
		"apply pavprovisioners cbt",
		"apply csidrivers cbt",
		"apply secrets pav-cbt-snapshot-metadata-tls",
		"apply services pav-cbt-snapshot-metadata",
		"apply snapshotmetadataservices cbt",
		"apply statefulsets pav-cbt-controller",
		"apply daemonsets pav-cbt-node",
		"apply pavprovisioners/status cbt")

	sec, sms := f.tlsSecret("cbt"), f.sms("cbt")
	checkOwner(t, "Secret", sec, "uid-1")
	checkOwner(t, "SnapshotMetadataService", sms, "uid-1")
	if sec.Type != corev1.SecretTypeTLS {
		t.Errorf("Secret type %s", sec.Type)
	}
	spec, _ := sms.Object["spec"].(map[string]any)
	ca, _ := base64.StdEncoding.DecodeString(spec["caCert"].(string))
	if spec["address"] != "pav-cbt-snapshot-metadata.pav:6443" || spec["audience"] != "pav.albertofaria.github.io/snapshot-metadata/cbt" || string(ca) != string(sec.Data[keyCACert]) {
		t.Errorf("SnapshotMetadataService spec %v", spec)
	}
	// A client that trusts the SnapshotMetadataService's CA accepts the
	// sidecar's certificate for the address it names.
	verify(t, ca, sec.Data[keyCert], "pav-cbt-snapshot-metadata.pav", time.Now())

	c := f.condition("cbt", v1alpha1.ConditionSnapshotMetadata)
	if c.Status != metav1.ConditionTrue || c.Reason != reasonServing || !strings.Contains(c.Message, "address pav-cbt-snapshot-metadata.pav:6443") {
		t.Errorf("condition %+v", c)
	}
	if ev := f.drainEvents(); !hasEvent(ev, "Normal Applied", "created Secret pav/pav-cbt-snapshot-metadata-tls", "created Service pav/pav-cbt-snapshot-metadata", "created SnapshotMetadataService cbt") ||
		!hasEvent(ev, "Normal SnapshotMetadataServing") {
		t.Errorf("events %v", ev)
	}

	// Nothing changed: nothing written, the certificates kept; also by a
	// new manager.
	mustReconcile(t, f, "cbt")
	wantWrites(t, f)
	f.restart(Settings{})
	mustReconcile(t, f, "cbt")
	wantWrites(t, f)
	if !sameData(f.tlsSecret("cbt").Data, sec.Data) {
		t.Error("the certificates changed")
	}

	// Drift: the SnapshotMetadataService edited, the Service deleted.
	sms.Object["spec"].(map[string]any)["audience"] = "someone-else"
	if _, err := f.dyn.Resource(SnapshotMetadataServiceGVR).Update(f.ctx, sms, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := f.kube.CoreV1().Services(ns).Delete(f.ctx, "pav-cbt-snapshot-metadata", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.settle()
	mustReconcile(t, f, "cbt")
	wantWrites(t, f, "apply services pav-cbt-snapshot-metadata", "apply snapshotmetadataservices cbt")

	// snapshotMetadata dropped from the spec: all of it goes, the
	// condition too.
	f.edit("cbt", func(u *unstructured.Unstructured) { delete(u.Object["spec"].(map[string]any), "snapshotMetadata") })
	mustReconcile(t, f, "cbt")
	if f.sms("cbt") != nil || f.tlsSecret("cbt") != nil {
		t.Error("the SnapshotMetadataService or the Secret is left")
	}
	if _, err := f.kube.CoreV1().Services(ns).Get(f.ctx, "pav-cbt-snapshot-metadata", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the Service is left: %v", err)
	}
	if meta.FindStatusCondition(f.provisioner("cbt").Status.Conditions, v1alpha1.ConditionSnapshotMetadata) != nil {
		t.Error("condition SnapshotMetadata is left")
	}
	if container(&f.statefulSet("cbt").Spec.Template.Spec, containerSnapshotMetadata) != nil {
		t.Error("the sidecar is left")
	}
}

// A cluster without the SnapshotMetadataService CRD: the sidecar, its Secret
// and Service are deployed, the condition says what to install, and nothing
// fails or loops.
func TestSnapshotMetadataWithoutTheCRD(t *testing.T) {
	f := newFixture(t, Settings{})
	f.withSnapshotMetadataCRD(false)
	f.create(cbtProvisioner("cbt", "uid-1", 1))
	mustReconcile(t, f, "cbt")
	c := f.condition("cbt", v1alpha1.ConditionSnapshotMetadata)
	if c.Status != metav1.ConditionFalse || c.Reason != reasonCRDMissing || !strings.Contains(c.Message, "snapshotmetadataservices.cbt.storage.k8s.io") {
		t.Errorf("condition %+v", c)
	}
	if f.tlsSecret("cbt") == nil || container(&f.statefulSet("cbt").Spec.Template.Spec, containerSnapshotMetadata) == nil {
		t.Error("the sidecar or its Secret is missing")
	}
	if ev := f.drainEvents(); !hasEvent(ev, "Warning SnapshotMetadataCRDMissing") {
		t.Errorf("events %v", ev)
	}
	if r := f.condition("cbt", v1alpha1.ConditionReady); r.Reason != reasonDeploying {
		t.Errorf("Ready %s/%s: the missing CRD must not hold the provisioner's readiness", r.Status, r.Reason)
	}
	// Again: the same condition, no event, no write but none.
	mustReconcile(t, f, "cbt")
	wantWrites(t, f)
	if ev := f.drainEvents(); len(ev) != 0 {
		t.Errorf("events %v", ev)
	}
	// Deleting the provisioner removes the Secret and Service without the CRD.
	f.markDeleted("cbt")
	mustReconcile(t, f, "cbt")
	mustReconcile(t, f, "cbt")
	if f.tlsSecret("cbt") != nil {
		t.Error("the Secret is left after the deletion")
	}
}

func verify(t *testing.T, caPEM, certPEM []byte, name string, at time.Time) {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("no CA")
	}
	b, _ := pem.Decode(certPEM)
	if b == nil {
		t.Fatal("no certificate")
	}
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: name, CurrentTime: at, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("the certificate does not verify for %s: %v", name, err)
	}
}

func TestCertificates(t *testing.T) {
	names := []string{"svc", "svc.pav", "svc.pav.svc", "svc.pav.svc.cluster.local"}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	first, renewAt, err := certificates(nil, "svc.pav", names, now)
	if err != nil {
		t.Fatal(err)
	}
	verify(t, first[keyCACert], first[keyCert], "svc.pav", now)
	if want := now.Add(servingValidity - servingRenewBefore); !renewAt.Equal(want) {
		t.Errorf("renew at %s, want %s", renewAt, want)
	}
	for _, tc := range []struct {
		name            string
		data            func() map[string][]byte
		names           []string
		at              time.Time
		sameCA, sameTLS bool
	}{
		{"valid: kept", func() map[string][]byte { return first }, names, now.Add(24 * time.Hour), true, true},
		{"serving certificate due: re-issued, same CA", func() map[string][]byte { return first }, names, renewAt.Add(time.Hour), true, false},
		{"other names: re-issued, same CA", func() map[string][]byte { return first }, names[:2], now, true, false},
		{"a broken key: re-issued", func() map[string][]byte {
			d := copyData(first)
			d[keyKey] = []byte("garbage")
			return d
		}, names, now, true, false},
		{"another certificate's key: re-issued", func() map[string][]byte {
			other, _, _ := certificates(nil, "svc.pav", names, now)
			d := copyData(first)
			d[keyKey] = other[keyKey]
			return d
		}, names, now, true, false},
		{"CA due: everything new", func() map[string][]byte { return first }, names, now.Add(caValidity - caRenewBefore + time.Hour), false, false},
		{"no CA key: everything new", func() map[string][]byte {
			d := copyData(first)
			delete(d, keyCAKey)
			return d
		}, names, now, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, renewAt, err := certificates(tc.data(), "svc.pav", tc.names, tc.at)
			if err != nil {
				t.Fatal(err)
			}
			if same := string(got[keyCACert]) == string(first[keyCACert]); same != tc.sameCA {
				t.Errorf("CA kept: %v, want %v", same, tc.sameCA)
			}
			if same := string(got[keyCert]) == string(first[keyCert]); same != tc.sameTLS {
				t.Errorf("serving certificate kept: %v, want %v", same, tc.sameTLS)
			}
			verify(t, got[keyCACert], got[keyCert], tc.names[len(tc.names)-1], tc.at)
			if !renewAt.After(tc.at) {
				t.Errorf("renew at %s, not after %s", renewAt, tc.at)
			}
		})
	}
}

func copyData(d map[string][]byte) map[string][]byte {
	out := map[string][]byte{}
	for k, v := range d {
		out[k] = v
	}
	return out
}
