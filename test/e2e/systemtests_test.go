//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"
)

// PaV's own system tests (tests/system-tests/*.bash in albertofaria/pav), one
// test each, run the way they run them: kubectl only, after the install, with
// a PavProvisioner applied alone, and `kubectl delete pav ... --timeout=60s`
// that must succeed. Written from their description; the images are busybox
// (no registry here) and PaV's 60-second "stays Pending" holds are
// systemHold, to keep the suite short.

const systemHold = 15 * time.Second

// systemProvisioner is PaV's system-test provisioner: every pod of every phase
// but staging writes a file to /pav and succeeds; staging writes a greeting and
// the claim's name. The failure test's version takes each phase's command from
// an annotation of the claim, when there is one.
func systemProvisioner(commandsFromClaim bool) string {
	cmd := func(phase, def string) string {
		if !commandsFromClaim {
			return def
		}
		if phase == "staging" { // a template cannot nest in the expression below
			def = "mkdir /pav/volume && echo 'Hello, world!' > /pav/volume/greeting"
		}
		return fmt.Sprintf(`{{ pvc.metadata.annotations['%s'] | default(%q) if pvc is defined else %q }}`, phase, def, def)
	}
	pod := func(phase, script string) string {
		return fmt.Sprintf(`
    podTemplate:
      spec:
        restartPolicy: Never
        containers:
          - name: container
            image: %s
            imagePullPolicy: IfNotPresent
            command: [sh, -c, %q]`, busybox, cmd(phase, script))
	}
	return `apiVersion: pav.albertofaria.github.io/v1alpha1
kind: PavProvisioner
metadata:
  name: my-provisioner
spec:
  provisioningModes: [Dynamic, Static]
  volumeValidation:` + pod("validation", "echo foo > /pav/bar") + `
  volumeCreation:
    capacity: 1Ei` + pod("creation", "echo foo > /pav/bar") + `
  volumeDeletion:` + pod("deletion", "echo foo > /pav/bar") + `
  volumeStaging:` + pod("staging", "mkdir /pav/volume && echo 'Hello, world!' > /pav/volume/greeting && echo {{ pvc.metadata.name | tobash }} > /pav/volume/pvc-name") + `
  volumeUnstaging:` + pod("unstaging", "echo foo > /pav/bar") + `
`
}

const (
	systemSC = `apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: my-sc}
provisioner: my-provisioner
`
	systemPV = `apiVersion: v1
kind: PersistentVolume
metadata: {name: my-pv}
spec:
  csi: {driver: my-provisioner, volumeHandle: hello}
  accessModes: [ReadWriteOnce]
  capacity: {storage: 1Gi}
`
)

func systemPVC(name, annotations string, static bool) string {
	y := fmt.Sprintf("apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: %s\n", name)
	if annotations != "" {
		y += "  annotations: {" + annotations + "}\n"
	}
	y += "spec:\n  accessModes: [ReadWriteOnce]\n  resources: {requests: {storage: 1Gi}}\n"
	if static {
		y += "  storageClassName: \"\"\n  volumeName: my-pv\n"
	} else {
		y += "  storageClassName: my-sc\n"
	}
	return y
}

func systemPod(name string, claims ...string) string {
	y := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
    - name: container
      image: %s
      imagePullPolicy: IfNotPresent
      command: [sh, -c, 'for d in /mnt/*; do cat $d/greeting $d/pvc-name; done']
      volumeMounts:
`, name, busybox)
	for _, c := range claims {
		y += fmt.Sprintf("        - {name: %s, mountPath: /mnt/%s}\n", c, c)
	}
	y += "  volumes:\n"
	for _, c := range claims {
		y += fmt.Sprintf("    - {name: %s, persistentVolumeClaim: {claimName: %s}}\n", c, c)
	}
	return y
}

// systemEnv is one system test: a namespace, files for kubectl, and cleanup of
// the cluster-scoped objects (my-provisioner, my-sc, my-pv) whatever happens.
type systemEnv struct {
	*env
	dir string
}

func newSystemEnv(t *testing.T) *systemEnv {
	e := &systemEnv{env: newEnv(t), dir: t.TempDir()}
	// PaV's names are cluster-scoped and fixed: a run killed before its
	// clean-up (a test timeout, an interrupted make e2e) must not fail the next.
	deleteSystemObjects()
	t.Cleanup(func() {
		// After a failure: claims first, so that the provisioner can go.
		_, _ = kubectlErr("-n", e.ns, "delete", "pods,pvc", "--all", "--timeout=60s")
		deleteSystemObjects()
	})
	return e
}

// deleteSystemObjects deletes the cluster-scoped objects of PaV's system tests.
func deleteSystemObjects() {
	_, _ = kubectlErr("delete", "pav", "my-provisioner", "--ignore-not-found", "--timeout=90s")
	_, _ = kubectlErr("delete", "storageclass", "my-sc", "--ignore-not-found")
	_, _ = kubectlErr("delete", "pv", "my-pv", "--ignore-not-found")
}

// file writes a manifest for kubectl -f.
func (e *systemEnv) file(name, y string) string {
	e.t.Helper()
	p := filepath.Join(e.dir, name)
	if err := os.WriteFile(p, []byte(y), 0o644); err != nil {
		e.t.Fatal(err)
	}
	return p
}

func (e *systemEnv) kubectl(args ...string) string {
	e.t.Helper()
	return kubectl(e.t, append([]string{"-n", e.ns}, args...)...)
}

// waitFor is `kubectl wait` on an object in the test's namespace.
func (e *systemEnv) waitFor(what, cond string, d time.Duration) {
	e.t.Helper()
	e.kubectl("wait", what, "--for="+cond, fmt.Sprintf("--timeout=%ds", int(d.Seconds())))
}

// staysPhase checks that an object keeps a phase for d.
func (e *systemEnv) staysPhase(what, phase string, d time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if got := e.kubectl("get", what, "-o", "jsonpath={.status.phase}"); got != phase {
			e.t.Fatalf("%s is %s, want it to stay %s", what, got, phase)
		}
		time.Sleep(2 * time.Second)
	}
}

// podReadsHello runs PaV's pod my-pod on claims: it must read each volume's
// "Hello, world!" and claim name, in order; then it is deleted.
func (e *systemEnv) podReadsHello(claims ...string) {
	e.t.Helper()
	e.kubectl("create", "-f", e.file("pod.yaml", systemPod("my-pod", claims...)))
	e.waitFor("pod/my-pod", "jsonpath={.status.phase}=Succeeded", 60*time.Second)
	want := ""
	for _, c := range claims {
		want += "Hello, world!\n" + c + "\n"
	}
	if out := e.kubectl("logs", "my-pod"); out != want {
		e.t.Fatalf("the pod read %q, want %q", out, want)
	}
	e.kubectl("delete", "pod", "my-pod", "--timeout=60s")
}

// deletePav is PaV's last step: `kubectl delete pav my-provisioner
// --timeout=60s` must succeed, and pav leaves nothing behind.
func (e *systemEnv) deletePav() {
	e.t.Helper()
	deleteProvisioner(e.t, "my-provisioner")
}

func TestSystemDynamicProvisioning(t *testing.T) {
	inLane(t, laneOwn)
	e := newSystemEnv(t)
	e.kubectl("create", "-f", e.file("provisioner.yaml", systemProvisioner(false)))
	e.kubectl("create", "-f", e.file("sc.yaml", systemSC))
	e.kubectl("create", "-f", e.file("pvc.yaml", systemPVC("my-pvc", "", false)))
	start := time.Now()
	e.waitFor("pvc/my-pvc", "jsonpath={.status.phase}=Bound", 60*time.Second)
	t.Logf("PVC Bound %v after the PavProvisioner was created", time.Since(start).Round(100*time.Millisecond))
	e.kubectl("delete", "-f", e.file("sc.yaml", systemSC))
	e.podReadsHello("my-pvc")
	e.kubectl("delete", "pvc", "my-pvc", "--timeout=60s")
	e.deletePav()
}

func TestSystemStaticProvisioning(t *testing.T) {
	inLane(t, laneOwn)
	e := newSystemEnv(t)
	e.kubectl("create", "-f", e.file("provisioner.yaml", systemProvisioner(false)))
	e.kubectl("create", "-f", e.file("pv.yaml", systemPV))
	e.kubectl("create", "-f", e.file("pvc.yaml", systemPVC("my-pvc", "", true)))
	e.waitFor("pvc/my-pvc", "jsonpath={.status.phase}=Bound", 60*time.Second)
	e.podReadsHello("my-pvc")
	e.kubectl("delete", "pvc", "my-pvc", "--timeout=60s")
	// The static PV stays (Released, reclaim policy Retain): it does not hold the provisioner.
	e.deletePav()
	if phase := kubectl(t, "get", "pv", "my-pv", "-o", "jsonpath={.status.phase}"); phase != "Released" {
		t.Errorf("my-pv is %s, want it kept (Released)", phase)
	}
}

func TestSystemDeletion(t *testing.T) {
	inLane(t, laneOwn)
	e := newSystemEnv(t)
	e.kubectl("create", "-f", e.file("provisioner.yaml", systemProvisioner(false)))
	e.kubectl("create", "-f", e.file("sc.yaml", systemSC))
	e.kubectl("create", "-f", e.file("pvc.yaml", systemPVC("my-pvc", "", false)))
	e.waitFor("pvc/my-pvc", "jsonpath={.status.phase}=Bound", 60*time.Second)
	_, _ = kubectlErr("delete", "pav", "my-provisioner", "--timeout=1s")
	time.Sleep(systemHold)
	kubectl(t, "get", "pav", "my-provisioner") // still there
	// Staging is refused: the pod stays Pending.
	e.kubectl("create", "-f", e.file("pod.yaml", systemPod("my-pod", "my-pvc")))
	e.staysPhase("pod/my-pod", "Pending", systemHold)
	e.kubectl("delete", "pod", "my-pod", "--timeout=120s")
	// Provisioning is refused: another claim stays Pending (and is never deleted).
	e.kubectl("create", "-f", e.file("pvc2.yaml", systemPVC("my-other-pvc", "", false)))
	e.staysPhase("pvc/my-other-pvc", "Pending", systemHold)
	e.kubectl("delete", "-f", e.file("sc.yaml", systemSC))
	kubectl(t, "get", "pav", "my-provisioner")
	// Deletion works while the provisioner is being deleted; then it goes.
	e.kubectl("delete", "pvc", "my-pvc", "--timeout=60s")
	e.deletePav()
}

func TestSystemFailure(t *testing.T) {
	inLane(t, laneOwn)
	e := newSystemEnv(t)
	e.kubectl("create", "-f", e.file("provisioner.yaml", systemProvisioner(true)))
	e.kubectl("create", "-f", e.file("sc.yaml", systemSC))
	for _, phase := range []string{"validation", "creation"} {
		claim := "my-pvc-" + phase
		e.kubectl("create", "-f", e.file(claim+".yaml", systemPVC(claim, phase+": 'echo "+phase+" fails > /pav/error; exit 1'", false)))
		e.staysPhase("pvc/"+claim, "Pending", systemHold)
		e.waitEvent("PersistentVolumeClaim", claim, "ProvisioningFailed", timeout, phase+" fails")
		e.kubectl("delete", "pvc", claim, "--timeout=60s")
	}
	e.kubectl("create", "-f", e.file("pvc.yaml", systemPVC("my-pvc", "staging: 'echo staging fails > /pav/error; exit 1'", false)))
	e.waitFor("pvc/my-pvc", "jsonpath={.status.phase}=Bound", 60*time.Second)
	e.kubectl("create", "-f", e.file("pod.yaml", systemPod("my-pod", "my-pvc")))
	e.staysPhase("pod/my-pod", "Pending", systemHold)
	e.waitEvent("Pod", "my-pod", "FailedMount", timeout, "staging fails")
	e.kubectl("delete", "pod", "my-pod", "--timeout=60s")
	e.kubectl("delete", "pvc", "my-pvc", "--timeout=60s")
	kubectl(t, "delete", "sc", "my-sc", "--timeout=60s")
	e.deletePav()
}

func TestSystemMountThreeVolumes(t *testing.T) {
	inLane(t, laneOwn)
	e := newSystemEnv(t)
	e.kubectl("create", "-f", e.file("provisioner.yaml", systemProvisioner(false)))
	e.kubectl("create", "-f", e.file("sc.yaml", systemSC))
	claims := []string{"my-pvc-1", "my-pvc-2", "my-pvc-3"}
	for _, c := range claims {
		e.kubectl("create", "-f", e.file(c+".yaml", systemPVC(c, "", false)))
	}
	for _, c := range claims {
		e.waitFor("pvc/"+c, "jsonpath={.status.phase}=Bound", 60*time.Second)
	}
	e.podReadsHello(claims...)
	for _, c := range claims {
		e.kubectl("delete", "pvc", c, "--timeout=60s")
	}
	e.deletePav()
}

// Every example provisioner is admitted and deleted within 60 s. The examples'
// names are taken by the setup's deployment (hello-world), so each is created
// under a suffixed name.
func TestSystemCreateExampleProvisioners(t *testing.T) {
	inLane(t, laneOwn)
	files, err := filepath.Glob(filepath.Join(repo, "examples", "*", "provisioner.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples: %v", err)
	}
	sort.Strings(files)
	dir := t.TempDir()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		u := toObject(t, string(b))
		name := u.GetName() + "-x"
		u.SetName(name)
		out := filepath.Join(dir, filepath.Base(filepath.Dir(f))+".yaml")
		j, _ := u.MarshalJSON()
		if err := os.WriteFile(out, j, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Run(filepath.Base(filepath.Dir(f)), func(t *testing.T) {
			t.Cleanup(func() { _, _ = kubectlErr("delete", "-f", out, "--ignore-not-found", "--timeout=90s") })
			kubectl(t, "create", "-f", out)
			start := time.Now()
			kubectl(t, "delete", "-f", out, "--timeout=60s")
			if left := leftovers(bgCtx(), name); len(left) > 0 {
				t.Fatalf("left: %v", left)
			}
			t.Logf("created and deleted in %v", time.Since(start).Round(100*time.Millisecond))
		})
	}
}
