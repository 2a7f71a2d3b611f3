package main

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// renderOut is what `pav render` prints.
type renderOut struct {
	Phase    string `json:"phase"`
	Creation *struct {
		Handle   string `json:"handle"`
		Capacity *int64 `json:"capacity"`
	} `json:"creation"`
	Validation *struct {
		Result string `json:"result"`
	} `json:"validation"`
	Pod  *corev1.Pod `json:"pod"`
	Note string      `json:"note"`
}

func renderPhase(t *testing.T, args ...string) renderOut {
	t.Helper()
	code, out, errOut := runCmd(t, "", append([]string{"render"}, args...)...)
	if code != 0 {
		t.Fatalf("pav render %s: exit %d: %s", strings.Join(args, " "), code, errOut)
	}
	var r renderOut
	if err := yaml.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return r
}

// script is everything the pod's first container runs (command and args), one string.
func script(t *testing.T, r renderOut) string {
	t.Helper()
	if r.Pod == nil || len(r.Pod.Spec.Containers) == 0 {
		t.Fatalf("phase %s rendered no pod (%s)", r.Phase, r.Note)
	}
	c := r.Pod.Spec.Containers[0]
	return strings.Join(append(append([]string{}, c.Command...), c.Args...), " ")
}

func wantAll(t *testing.T, what, s string, subs ...string) {
	t.Helper()
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			t.Errorf("%s lacks %q:\n%s", what, sub, s)
		}
	}
}

const pav011 = "../../test/pav-0.1.1/"

// PaV 0.1.1's own example provisioners (test/pav-0.1.1, unchanged copies) evaluate with
// `pav render` in every phase they define, to the pods PaV's documentation describes.
func TestRenderPaVExamples(t *testing.T) {
	// The copies are PaV's files, byte for byte (see test/pav-0.1.1/README.md).
	for file, sum := range map[string]string{
		"1-hello-world":            "62b8ea535064d83d7ac2c90435e21b5f178a6c673afc7348e94849010c2a5209",
		"2-google-cloud-storage":   "780e932a211bc737e71b9da60b149e324e6ae447df8a10937d439ca2c703afaa",
		"3-transparent-encryption": "fac5c27c8ef04b1bd19de1ba4d3f1fe7c7f35a5cd4e4c228884036cb3ab74800",
	} {
		b, err := os.ReadFile(pav011 + "examples/" + file + "/provisioner.yaml")
		if err != nil {
			t.Fatal(err)
		}
		if got := sha256.Sum256(b); hex.EncodeToString(got[:]) != sum {
			t.Fatalf("test/pav-0.1.1/examples/%s/provisioner.yaml is no longer PaV's file (sha256 %x)", file, got)
		}
	}
	obj := func(name string) string { return pav011 + "objects/" + name + ".yaml" }

	t.Run("hello-world", func(t *testing.T) {
		f := []string{"-f", pav011 + "examples/1-hello-world/provisioner.yaml"}
		r := renderPhase(t, append(f, "--phase", "validation", "--pvc", obj("hello-pvc"))...)
		wantAll(t, "validation", r.Validation.Result, "passes")
		r = renderPhase(t, append(f, "--phase", "creation", "--pvc", obj("hello-pvc"))...)
		if r.Creation == nil || r.Creation.Capacity == nil || *r.Creation.Capacity != 1<<20 || r.Pod != nil {
			t.Fatalf("creation: %+v, want capacity = the requested 1Mi and no pod", r)
		}
		r = renderPhase(t, append(f, "--phase", "staging", "--pv", obj("hello-pv"), "--pvc", obj("hello-pvc"), "--node", obj("node"))...)
		wantAll(t, "staging", script(t, r), `/bin/bash -c mkdir /pav/volume && echo "Hello world!" > /pav/volume/greeting`)
		if r.Pod.Spec.NodeName != "node-1" || r.Pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
			t.Fatalf("staging pod on %q, restart %q", r.Pod.Spec.NodeName, r.Pod.Spec.RestartPolicy)
		}
		r = renderPhase(t, append(f, "--phase", "unstaging", "--pv", obj("hello-pv"), "--node", obj("node"))...)
		if r.Pod != nil {
			t.Fatal("hello-world has no unstaging pod")
		}
	})

	t.Run("google-cloud-storage", func(t *testing.T) {
		f := []string{"-f", pav011 + "examples/2-google-cloud-storage/provisioner.yaml"}
		dyn := []string{"--pvc", obj("gcs-pvc"), "--sc", obj("gcs-sc")}
		r := renderPhase(t, append(append(f, "--phase", "creation"), dyn...)...)
		if r.Creation == nil || r.Creation.Capacity == nil || *r.Creation.Capacity != 1<<60 {
			t.Fatalf("creation capacity: %+v, want 1Ei", r.Creation)
		}
		if r.Pod.Namespace != "gcs" {
			t.Fatalf("creation pod in namespace %q, want the secretNamespace parameter", r.Pod.Namespace)
		}
		wantAll(t, "creation", script(t, r), "gsutil \"$@\" mb", "-c STANDARD", "-l EUROPE-WEST2",
			"gs://pvc-66666666-7777-4888-9999-aaaaaaaaaaaa", "GSUtil:default_project_id=my-project")
		if v := r.Pod.Spec.Volumes[0]; v.Secret == nil || v.Secret.SecretName != "google-cloud-service-account" {
			t.Fatalf("secret volume: %+v", v)
		}
		if strings.Contains(script(t, r), "--retention") {
			t.Fatal("--retention without the retentionPeriod parameter")
		}
		r = renderPhase(t, append(append(f, "--phase", "deletion", "--pv", obj("gcs-pv")), dyn...)...)
		wantAll(t, "deletion", script(t, r), "rm -r gs://pvc-66666666-7777-4888-9999-aaaaaaaaaaaa", "bucket does not exist")
		// Dynamic volume, ReadWriteMany claim: caches off.
		r = renderPhase(t, append(f, "--phase", "staging", "--pv", obj("gcs-pv"), "--pvc", obj("gcs-pvc"), "--node", obj("node"))...)
		wantAll(t, "staging", script(t, r), "gcsfuse", "--stat-cache-ttl 0", "--type-cache-ttl 0",
			"pvc-66666666-7777-4888-9999-aaaaaaaaaaaa \\\n  /pav/volume", "touch /pav/ready")
		if !isPrivileged(r.Pod.Spec.Containers[0]) || r.Pod.Namespace != "gcs" {
			t.Fatal("the gcsfuse staging pod must be privileged and in the secretNamespace")
		}
		// Static: an existing bucket, parameters from volumeAttributes.
		r = renderPhase(t, append(f, "--phase", "validation", "--pv", obj("gcs-static-pv"))...)
		wantAll(t, "static validation", r.Validation.Result, "passes")
		r = renderPhase(t, append(f, "--phase", "staging", "--pv", obj("gcs-static-pv"), "--node", obj("node"))...)
		wantAll(t, "static staging", script(t, r), "--implicit-dirs", "my-existing-bucket \\\n  /pav/volume")
	})

	t.Run("transparent-encryption", func(t *testing.T) {
		f := []string{"-f", pav011 + "examples/3-transparent-encryption/provisioner.yaml"}
		r := renderPhase(t, append(f, "--phase", "validation", "--pvc", obj("crypt-pvc"))...)
		wantAll(t, "validation", r.Validation.Result, "passes")
		for _, ph := range []string{"creation", "deletion", "staging", "unstaging"} {
			args := append(f, "--phase", ph, "--pvc", obj("crypt-pvc"), "--pv", obj("crypt-pv"), "--node", obj("node"))
			r := renderPhase(t, args...)
			if r.Pod.Namespace != "tenant" {
				t.Fatalf("%s pod in namespace %q, want the claim's", ph, r.Pod.Namespace)
			}
			var claim, secret string
			for _, v := range r.Pod.Spec.Volumes {
				if v.PersistentVolumeClaim != nil {
					claim = v.PersistentVolumeClaim.ClaimName
				}
				if v.Secret != nil {
					secret = v.Secret.SecretName
				}
			}
			if claim != "crypt-underlying-pvc" || secret != "crypt-secret" {
				t.Fatalf("%s pod: underlying claim %q, secret %q (from the PVC's annotations)", ph, claim, secret)
			}
			want := map[string]string{
				"creation":  "cryptsetup -q luksFormat /volume /secret/passphrase",
				"deletion":  "! cryptsetup isLuks /volume || cryptsetup -q erase /volume",
				"staging":   `cryptsetup open /volume "$dev" --key-file /secret/passphrase`,
				"unstaging": "cryptsetup close pvc-bbbbbbbb-cccc-4ddd-8eee-ffffffffffff || (( $? == 4 ))",
			}[ph]
			wantAll(t, ph, script(t, r), want)
		}
	})
}

func isPrivileged(c corev1.Container) bool {
	return c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged
}

// Every phase of every example in examples/ evaluates with its testdata objects.
func TestRenderExamples(t *testing.T) {
	dirs, err := filepath.Glob("../../examples/*/provisioner.yaml")
	if err != nil || len(dirs) < 5 {
		t.Fatalf("examples: %v %v", dirs, err)
	}
	for _, p := range dirs {
		dir := filepath.Dir(p)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			td := func(name string) string { return filepath.Join(dir, "testdata", name+".yaml") }
			var objs []string
			for _, o := range []string{"pvc", "sc", "pv", "node"} {
				if _, err := os.Stat(td(o)); err == nil {
					objs = append(objs, "--"+o, td(o))
				}
			}
			pods := 0
			for _, ph := range []string{"validation", "creation", "deletion", "staging", "unstaging"} {
				r := renderPhase(t, append([]string{"-f", p, "--phase", ph}, objs...)...)
				if r.Validation != nil && !strings.Contains(r.Validation.Result, "passes") {
					t.Fatalf("validation: %s", r.Validation.Result)
				}
				if r.Pod != nil {
					pods++
				}
			}
			if pods == 0 {
				t.Fatal("no phase rendered a pod")
			}
		})
	}
}

// The examples' templates, rendered with their testdata: the details that make them work.
func TestRenderExampleDetails(t *testing.T) {
	ex := func(name string) (string, func(string) string) {
		d := "../../examples/" + name + "/"
		return d + "provisioner.yaml", func(o string) string { return d + "testdata/" + o + ".yaml" }
	}

	p, td := ex("loop-block")
	r := renderPhase(t, "-f", p, "--phase", "creation", "--pvc", td("pvc"))
	if *r.Creation.Capacity != 64<<20 || r.Pod.Spec.NodeName != "" {
		t.Fatalf("loop-block creation: capacity %d, node %q", *r.Creation.Capacity, r.Pod.Spec.NodeName)
	}
	wantAll(t, "loop-block creation", script(t, r), `echo "$handle" > /pav/handle`, "truncate -s 67108864")
	r = renderPhase(t, "-f", p, "--phase", "deletion", "--pvc", td("pvc"), "--pv", td("pv"))
	if r.Pod.Spec.NodeName != "node-1" {
		t.Fatalf("loop-block deletion pod on %q, want the node in the handle", r.Pod.Spec.NodeName)
	}
	r = renderPhase(t, "-f", p, "--phase", "staging", "--pvc", td("pvc"), "--pv", td("pv"), "--node", td("node"), "--read-only")
	wantAll(t, "loop-block staging", script(t, r), "losetup --find --show --read-only", "mknod /pav/volume b")

	p, td = ex("encryption")
	r = renderPhase(t, "-f", p, "--phase", "creation", "--pvc", td("pvc"), "--sc", td("sc"))
	wantAll(t, "encryption creation", script(t, r), `set -- "$@" --pbkdf pbkdf2`, `set -- "$@" --iter-time 100`, `cryptsetup luksFormat "$@" "$dev"`)
	if strings.Contains(script(t, r), "--cipher") || r.Pod.Namespace != "default" {
		t.Fatalf("encryption creation: %s in %s", script(t, r), r.Pod.Namespace)
	}

	// encrypted-fs, a pool per node: the volume goes on the claim of the node it is made
	// for, and so does its creation pod; staging mounts the claim of the node it runs on.
	p, td = ex("encrypted-fs")
	pool := []string{"--param", "underlyingClaimName=pool", "--param", "underlyingClaimNamespace=pool-ns", "--param", "secretName=s", "--param", "underlyingClaimPerNode=true"}
	r = renderPhase(t, append([]string{"-f", p, "--phase", "creation", "--pvc", td("pvc"), "--node", td("node")}, pool...)...)
	if r.Pod.Spec.NodeSelector["kubernetes.io/hostname"] != "node-1" || r.Pod.Spec.Volumes[1].PersistentVolumeClaim.ClaimName != "pool-node-1" || r.Pod.Namespace != "pool-ns" {
		t.Fatalf("encrypted-fs creation, pool per node: node selector %v, claim %+v, namespace %q", r.Pod.Spec.NodeSelector, r.Pod.Spec.Volumes[1], r.Pod.Namespace)
	}
	r = renderPhase(t, append([]string{"-f", p, "--phase", "staging", "--pvc", td("pvc"), "--pv", td("pv"), "--node", td("node")}, pool...)...)
	if r.Pod.Spec.Volumes[1].PersistentVolumeClaim.ClaimName != "pool-node-1" {
		t.Fatalf("encrypted-fs staging, pool per node: claim %+v", r.Pod.Spec.Volumes[1])
	}
	r = renderPhase(t, append([]string{"-f", p, "--phase", "creation", "--pvc", td("pvc")}, pool[:6]...)...)
	if len(r.Pod.Spec.NodeSelector) != 0 || r.Pod.Spec.Volumes[1].PersistentVolumeClaim.ClaimName != "pool" {
		t.Fatalf("encrypted-fs creation, one pool: node selector %v, claim %+v", r.Pod.Spec.NodeSelector, r.Pod.Spec.Volumes[1])
	}

	p, td = ex("object-bucket")
	r = renderPhase(t, "-f", p, "--phase", "staging", "--pvc", td("pvc"), "--pv", td("pv"), "--node", td("node"))
	wantAll(t, "object-bucket staging (ReadWriteMany)", script(t, r), "--dir-cache-time 100ms --attr-timeout 100ms", `rclone mount2 "$bucket" /pav/volume`)
	if r.Pod.Namespace != "pav-object-store" || r.Pod.Spec.TerminationGracePeriodSeconds == nil {
		t.Fatalf("object-bucket staging pod in %q", r.Pod.Namespace)
	}
	r = renderPhase(t, "-f", p, "--phase", "deletion", "--pvc", td("pvc"), "--sc", td("sc"), "--pv", td("pv"))
	if r.Pod.Spec.Containers[0].Image != "pav.local/object-bucket:dev" || len(r.Pod.Spec.Containers[0].Env) != 8 {
		t.Fatalf("object-bucket deletion container (YAML merge key): %+v", r.Pod.Spec.Containers[0])
	}
	wantAll(t, "object-bucket deletion", script(t, r), "grep -qx pvc-3d0f4c52-8a4e-4f5b-9c3e-5b1e2a7d9f10/", "rclone purge s3:pvc-3d0f4c52-8a4e-4f5b-9c3e-5b1e2a7d9f10")
}

// object-bucket's inline ephemeral volumes, rendered from a pod: a bucket named after the
// volume's id, the administrator's store (the Secret object-bucket-inline in pav's
// namespace), and any attribute but dirCacheTime refused by a validation pod that says so.
func TestRenderExampleInline(t *testing.T) {
	const d = "../../examples/object-bucket/"
	pod, node := d+"testdata/inline-pod.yaml", d+"testdata/node.yaml"
	// The kubelet's id of the pod's volume: csi-<sha256 of its UID and name>.
	sum := sha256.Sum256([]byte("9b0b7c1e-5d2a-4f3e-8c6b-2a1d0e9f8c7b" + "bucket"))
	bucket := "inline-" + hex.EncodeToString(sum[:])[:32]
	inline := func(ph string, more ...string) renderOut {
		return renderPhase(t, append([]string{"-f", d + "provisioner.yaml", "--phase", ph, "--inline-pod", pod}, more...)...)
	}
	r := inline("validation")
	if r.Pod != nil || !strings.Contains(r.Validation.Result, "passes") {
		t.Fatalf("validation of good attributes: pod %v, %s", r.Pod != nil, r.Validation.Result)
	}
	for _, c := range []struct{ param, want string }{
		{"endpoint=http://elsewhere:9000", "volumeAttributes key endpoint is not allowed on inline volumes of object-bucket"},
		{"secretNamespace=kube-system", "volumeAttributes key secretNamespace is not allowed"},
		{"dirCacheTime=1h; rm -rf /", "volumeAttributes dirCacheTime must be a duration such as 100ms, 2s or 1m"},
	} {
		r := inline("validation", "--param", c.param)
		wantAll(t, "validation of "+c.param, script(t, r), c.want, "> /pav/error; exit 1")
		if r.Pod.Namespace != "pav" {
			t.Errorf("validation pod in %q", r.Pod.Namespace)
		}
	}
	for _, ph := range []string{"creation", "deletion", "staging"} {
		r := inline(ph, "--node", node)
		if r.Pod.Namespace != "pav" || r.Pod.Spec.NodeName != "node-1" {
			t.Errorf("%s pod in %q on %q, want pav's namespace on the pod's node", ph, r.Pod.Namespace, r.Pod.Spec.NodeName)
		}
		wantAll(t, ph, script(t, r), bucket)
		env := map[string]string{}
		for _, e := range r.Pod.Spec.Containers[0].Env {
			switch {
			case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
				env[e.Name] = "secret " + e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
			default:
				env[e.Name] = e.Value
			}
		}
		for k, v := range map[string]string{"RCLONE_CONFIG_S3_ENDPOINT": "secret object-bucket-inline/endpoint",
			"RCLONE_CONFIG_S3_ACCESS_KEY_ID": "secret object-bucket-inline/accessKeyId", "RCLONE_CONFIG_S3_PROVIDER": "Other"} {
			if env[k] != v {
				t.Errorf("%s: %s = %q, want %q", ph, k, env[k], v)
			}
		}
	}
	wantAll(t, "staging", script(t, inline("staging", "--node", node)), "--dir-cache-time 2s")
	r = inline("creation")
	if r.Creation.Handle != "csi-"+hex.EncodeToString(sum[:]) || *r.Creation.Capacity != 1<<60 {
		t.Fatalf("creation: handle %s capacity %d", r.Creation.Handle, *r.Creation.Capacity)
	}
}
