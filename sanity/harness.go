// Package sanity runs csi-sanity (github.com/kubernetes-csi/csi-test/v5/pkg/sanity)
// in-process against pav's real CSI services — controller and node together, over
// a real unix socket, with real bind mounts — with the Kubernetes API replaced by
// a fake clientset and podrunner/fakekubelet running the phase pods. Staging
// pods of the test provisioner make a real directory (Filesystem) or a real loop
// device of the volume's size (Block) at /pav/volume, as a user's pods would.
//
// The suites live in sanity/filesystem and sanity/block: Ginkgo runs one suite
// per process.
package sanity

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/driver"
	"github.com/pods-as-volumes/pav/internal/fakekubelet"
	"github.com/pods-as-volumes/pav/internal/kube/kubetest"
	"github.com/pods-as-volumes/pav/internal/records/recordstest"
	"github.com/pods-as-volumes/pav/podrunner"
)

// NodeName is the fake node the node plugin serves.
const NodeName = "sanity-node"

// Provisioner is the PavProvisioner under test. The creation pod reports the
// capacity it was asked for (1 GiB when the request names none), or its source's
// when it restores a snapshot or clones a volume; the snapshot creation pod
// reports a handle of its own and the source volume's capacity; the expansion
// pod reports the capacity it was asked for; the staging and node expansion pods
// tell the fake kubelet the mode and capacity they must provide; the modification
// pod changes nothing (csi-sanity's ModifyVolume specs: tier is its mutable parameter).
const Provisioner = `apiVersion: pav.albertofaria.github.io/v1alpha1
kind: PavProvisioner
metadata:
  name: pav-sanity
spec:
  provisioningModes: [Dynamic, Static]
  volumeValidation:
    volumeModes: [Filesystem, Block]
    accessModes: [ReadWriteOnce, ReadOnlyMany, ReadWriteMany, ReadWriteOncePod]
  volumeCreation:
    contentSources: [Snapshot, Volume]
    podTemplate:
      spec:
        containers:
          - name: create
            image: busybox
            env:
              - {name: CAPACITY, value: "{% if source and source.capacity > requestedMinCapacity %}{{ source.capacity }}{% elif requestedMinCapacity > 0 %}{{ requestedMinCapacity }}{% else %}1073741824{% endif %}"}
              - {name: SOURCE, value: "{{ source.kind ~ ':' ~ source.handle if source else '' }}"}
  volumeDeletion:
    podTemplate:
      spec:
        containers: [{name: delete, image: busybox, command: [rm, -rf, "/backend/{{ handle | tobash }}"]}]
  snapshotCreation:
    podTemplate:
      spec:
        containers:
          - name: snapshot
            image: busybox
            env:
              - {name: HANDLE, value: "snap-{{ snapshotName | replace('/', '-') }}"}
              - {name: SIZE, value: "{{ volume.capacity }}"}
              - {name: VOLUME, value: "{{ volume.handle }}"}
  snapshotDeletion:
    podTemplate:
      spec:
        containers: [{name: delete, image: busybox, command: [rm, -rf, "/backend/snapshots/{{ handle | tobash }}"]}]
  # The GroupController service (csi-sanity's GroupController specs); members by their own pods.
  groupSnapshotCreation: {}
  volumeStaging:
    podTemplate:
      spec:
        containers:
          - name: stage
            image: busybox
            securityContext: {privileged: true}
            env:
              - {name: VOLUME_MODE, value: "{{ volumeMode }}"}
              - {name: CAPACITY, value: "{{ capacity }}"}
  volumeUnstaging:
    podTemplate:
      spec:
        containers: [{name: unstage, image: busybox, securityContext: {privileged: true}}]
  volumeExpansion:
    podTemplate:
      spec:
        containers:
          - name: expand
            image: busybox
            env:
              - {name: CAPACITY, value: "{{ requestedCapacity }}"}
  volumeNodeExpansion:
    podTemplate:
      spec:
        containers:
          - name: expand
            image: busybox
            securityContext: {privileged: true}
            env:
              - {name: VOLUME_MODE, value: "{{ volumeMode }}"}
              - {name: CAPACITY, value: "{{ capacity }}"}
  volumeModification:
    mutableParameters: [tier]
    podTemplate:
      spec:
        containers:
          - name: modify
            image: busybox
            env:
              - {name: TIER, value: "{{ mutableParams.tier | default('none') }}"}
`

// Run starts pav on a unix socket and runs csi-sanity with the given access type
// ("mount" or "block").
func Run(t *testing.T, accessType string) {
	if os.Geteuid() != 0 {
		t.Skip("csi-sanity against pav needs root: NodeStage/NodePublish make real bind mounts (CI runs as root)")
	}
	if accessType == "block" {
		if _, err := exec.LookPath("losetup"); err != nil {
			t.Skip("Block sanity needs losetup (util-linux) for the staging pod's loop device")
		}
	}
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: NodeName}})
	kubelet := fakekubelet.New(client, behaviour, fakekubelet.Options{Node: NodeName, Dir: filepath.Join(dir, "pods"), OnStart: onStart})
	if err := kubelet.Start(ctx); err != nil {
		t.Fatal(err)
	}
	provFile := filepath.Join(dir, "provisioner.yaml")
	if err := os.WriteFile(provFile, []byte(Provisioner), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := driver.Options{Mode: driver.ModeAll, NodeID: NodeName, ProvisionerFile: provFile,
		StateDir: filepath.Join(dir, "state"), Endpoint: "unix://" + filepath.Join(dir, "csi.sock"), Version: "sanity"}
	runner := podrunner.New(podrunner.Config{Client: kubetest.Wrap(client), Provisioner: "pav-sanity",
		ReportImage: "pav:sanity", PodTimeout: time.Minute})
	records := recordstest.NewClient()
	svc, _, err := driver.Build(ctx, opts, driver.Deps{Client: kubetest.Wrap(client), Dynamic: records, Runner: runner})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := driver.Listen(opts.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	srv := driver.NewGRPCServer(svc, nil)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	cfg := sanity.NewTestConfig()
	cfg.Address = opts.Endpoint
	cfg.TargetPath = filepath.Join(dir, "target")
	cfg.StagingPath = filepath.Join(dir, "staging")
	cfg.TestVolumeAccessType = accessType
	// Block volumes are real loop devices over sparse files: keep them small.
	cfg.TestVolumeSize = 64 << 20
	// A VolumeAttributesClass's parameters: the ModifyVolume specs create and modify
	// volumes with them (and expect an unknown key refused).
	cfg.TestVolumeMutableParameters = map[string]string{"tier": "gold"}
	sanity.Test(t, cfg)

	srv.Stop()
	// Every pod pav ran must be gone: callers remove finished pods once they
	// have recorded the outcome.
	if pods, err := client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{}); err != nil {
		t.Error(err)
	} else {
		for _, p := range pods.Items {
			t.Errorf("pod left behind: %s/%s (phase %s)", p.Namespace, p.Name, p.Labels[podrunner.LabelPhase])
		}
	}
	// And every record: each volume and snapshot csi-sanity created it also
	// deleted.
	for _, gvr := range []schema.GroupVersionResource{v1alpha1.VolumeGroupVersionResource, v1alpha1.SnapshotGroupVersionResource,
		v1alpha1.GroupSnapshotGroupVersionResource} {
		if objs, err := records.Resource(gvr).List(context.Background(), metav1.ListOptions{}); err != nil {
			t.Error(err)
		} else {
			for _, o := range objs.Items {
				t.Errorf("%s left behind: %s", gvr.Resource, o.GetName())
			}
		}
	}
	cancel()
	kubelet.Wait()
	leaks(t, dir)
}

// behaviour: every pod succeeds, except staging pods, which keep running
// (a FUSE daemon would) once /pav/ready exists.
func behaviour(pod *corev1.Pod) fakekubelet.Outcome {
	switch v1alpha1.Phase(pod.Labels[podrunner.LabelPhase]) {
	case v1alpha1.PhaseStaging:
		return fakekubelet.Outcome{Kind: fakekubelet.Run, Ready: true}
	case v1alpha1.PhaseCreation, v1alpha1.PhaseExpansion:
		return fakekubelet.Outcome{Kind: fakekubelet.Succeed, Files: map[string]string{"capacity": env(pod, "CAPACITY") + "\n"}}
	case v1alpha1.PhaseSnapshotCreation:
		return fakekubelet.Outcome{Kind: fakekubelet.Succeed, Files: map[string]string{"handle": env(pod, "HANDLE"), "capacity": env(pod, "SIZE")}}
	}
	return fakekubelet.Outcome{Kind: fakekubelet.Succeed}
}

// onStart does in /pav what the test provisioner's pods would do on a node.
func onStart(pod *corev1.Pod, pavDir string) error {
	switch v1alpha1.Phase(pod.Labels[podrunner.LabelPhase]) {
	case v1alpha1.PhaseStaging:
		if env(pod, "VOLUME_MODE") == string(corev1.PersistentVolumeBlock) {
			return makeLoopDevice(pavDir, env(pod, "CAPACITY"))
		}
		return os.MkdirAll(filepath.Join(pavDir, "volume"), 0o755)
	case v1alpha1.PhaseNodeExpansion:
		if env(pod, "VOLUME_MODE") == string(corev1.PersistentVolumeBlock) {
			size, err := strconv.ParseInt(env(pod, "CAPACITY"), 10, 64)
			if err != nil {
				return fmt.Errorf("CAPACITY %q: %w", env(pod, "CAPACITY"), err)
			}
			return fakekubelet.GrowLoop(pavDir, size)
		}
	case v1alpha1.PhaseUnstaging:
		if b, err := os.ReadFile(filepath.Join(pavDir, "loop")); err == nil {
			if out, err := exec.Command("losetup", "-d", strings.TrimSpace(string(b))).CombinedOutput(); err != nil {
				return fmt.Errorf("losetup -d: %v: %s", err, out)
			}
		}
	}
	return nil
}

// makeLoopDevice exposes a loop device of the volume's size as /pav/volume and
// remembers it for the unstaging pod.
func makeLoopDevice(pavDir, capacity string) error {
	size, err := strconv.ParseInt(capacity, 10, 64)
	if err != nil {
		return fmt.Errorf("CAPACITY %q: %w", capacity, err)
	}
	dev, err := fakekubelet.AttachLoop(pavDir, size)
	if dev != "" {
		if werr := os.WriteFile(filepath.Join(pavDir, "loop"), []byte(dev), 0o600); werr != nil && err == nil {
			err = werr
		}
	}
	return err
}

func env(pod *corev1.Pod, name string) string {
	for _, e := range pod.Spec.Containers[0].Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// leaks fails the test when a mount or a loop device outlives the suite.
func leaks(t *testing.T, dir string) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, dir) {
			t.Errorf("mount left behind: %s", line)
		}
	}
	out, _ := exec.Command("losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE").Output()
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, dir) {
			t.Errorf("loop device left behind: %s", line)
		}
	}
}
