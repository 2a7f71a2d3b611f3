package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/internal/provisioner"
	"github.com/pods-as-volumes/pav/internal/templating"
)

// loop-block's expansion, snapshot and copy phases (issue 8), evaluated through the
// driver's own Evaluator with contexts shaped as docs/beyond-pav.md says, and
// their scripts then run for real on files in a temporary directory (the paths of the
// node's /var/lib/pav-loop-block and of /pav rewritten): the files they leave are checked,
// not the text. `pav render` does not evaluate these phases (yet), hence the Evaluator.

const (
	lbDir    = "/var/lib/pav-loop-block"
	lbUID    = "9a4c6e2b-3d1f-4a8e-b5c7-1e0f2d3a4b5c"
	lbHandle = "pvc-" + lbUID + ".node-1"
	lbSnap   = "snapshot-0c1d2e3f-4a5b-4c6d-8e7f-8091a2b3c4d5"
	mib      = int64(1 << 20)
)

func loopBlock(t *testing.T) *v1alpha1.PavProvisioner {
	t.Helper()
	p, err := provisioner.LoadFile("../../examples/loop-block/provisioner.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := phase.Check(p); err != nil {
		t.Fatal(err)
	}
	return p
}

// The capabilities the example advertises follow from its spec.
func TestLoopBlockFeatures(t *testing.T) {
	f, err := phase.FeaturesOf(&loopBlock(t).Spec)
	if err != nil {
		t.Fatal(err)
	}
	if !f.Expansion || !f.OnlineExpansion || !f.NodeExpansion || !f.Snapshots || !f.Clones() || !f.Restores() {
		t.Fatalf("loop-block features: %+v, want online expansion with a node side, snapshots, clones and restores", f)
	}
	if !f.Capacity || f.CapacityRefresh.String() != "1m0s" || f.MaxVolumesPerNode != 32 {
		t.Fatalf("loop-block features: %+v, want storage capacity refreshed every minute and 32 volumes per node", f)
	}
}

// The capacity pod reports, per node, the pool's free space that its volumes cannot
// take: the file system's available bytes minus what the sparse files of its volumes may
// still grow into (snapshots, which are never written again, and copies being made count
// as what they hold), never below 0; the same figure as the largest volume.
func TestLoopBlockCapacity(t *testing.T) {
	needTools(t, "truncate", "stat")
	p := loopBlock(t)
	cfg, err := phase.NewEvaluator(offlinePVCs{}).Capacity(context.Background(), p,
		phase.CapacityVars(map[string]string{"kubernetes.io/hostname": "node-1"}, map[string]string{}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RefreshInterval.String() != "1m0s" || cfg.PodTemplate.Spec.NodeName != "" || cfg.PodTemplate.Spec.Containers[0].SecurityContext != nil {
		t.Fatalf("capacity pod %+v: want an unprivileged pod that pav pins to the segment", cfg.PodTemplate.Spec)
	}
	s := newSandbox(t)
	write := func(name string, size, written int64) {
		t.Helper()
		path := filepath.Join(s.files, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.Write(make([]byte, written)); err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	available := func() int64 {
		var st syscall.Statfs_t
		if err := syscall.Statfs(s.files, &st); err != nil {
			t.Fatal(err)
		}
		return int64(st.Bavail) * st.Frsize
	}
	// Other processes write to this disk too: what the pod saw is compared with what the
	// test sees around it, within a margin.
	const margin = 256 * mib
	check := func(what string, promised int64) {
		t.Helper()
		before := available()
		if err := s.run(t, cfg.PodTemplate); err != nil {
			t.Fatal(err)
		}
		after := available()
		got := s.pavCapacity(t)
		if m := s.pavFile(t, "maximumVolumeSize"); m != strconv.FormatInt(got, 10) {
			t.Errorf("%s: maximumVolumeSize %s, want the capacity %d", what, m, got)
		}
		lo, hi := max(min(before, after)-promised-margin, 0), max(max(before, after)-promised+margin, 0)
		if promised > max(before, after) {
			lo, hi = 0, 0
		}
		if got < lo || got > hi {
			t.Errorf("%s: capacity %d, want %d..%d (available %d..%d, promised %d)", what, got, lo, hi, before, after, promised)
		}
	}
	check("an empty pool", 0)
	// A volume of 64Mi with 1Mi written may still take 63Mi; one fully written, nothing.
	write(lbHandle+".img", 64*mib, mib)
	write("pvc-other.node-1.img", 4*mib, 4*mib)
	// A snapshot and a copy being made are not volumes.
	write("snapshots/"+lbSnap+".node-1.img", 64*mib, mib)
	write("pvc-copy.node-1.img.part", 64*mib, 0)
	check("volumes", 63*mib)
	// Promised more than the disk has (15 TiB: ext4's largest file is 16): full, not
	// negative.
	const huge = 15 << 40
	if available() >= huge {
		t.Skip("this disk has more than 15 TiB available")
	}
	write("pvc-huge.node-1.img", huge, 0)
	check("over-promised", huge+63*mib)
}

// lbClaim is testdata/pvc.yaml in the given volume mode.
func lbClaim(t *testing.T, mode corev1.PersistentVolumeMode, size int64) *corev1.PersistentVolumeClaim {
	t.Helper()
	b, err := os.ReadFile("../../examples/loop-block/testdata/pvc.yaml")
	if err != nil {
		t.Fatal(err)
	}
	pvc := &corev1.PersistentVolumeClaim{}
	if err := yaml.UnmarshalStrict(b, pvc); err != nil {
		t.Fatal(err)
	}
	pvc.Spec.VolumeMode = &mode
	pvc.Spec.Resources.Requests[corev1.ResourceStorage] = *resource.NewQuantity(size, resource.BinarySI)
	return pvc
}

// sandbox is a node's /var/lib/pav-loop-block and a pod's /pav, as temporary directories.
type sandbox struct{ files, pav string }

func newSandbox(t *testing.T) sandbox {
	s := sandbox{files: t.TempDir(), pav: t.TempDir()}
	return s
}

// run runs the first container's script of a rendered pod template as it would run on
// NODE_NAME node-1, with the sandbox's directories in place of the node's and /pav. It
// returns /pav/error's content when the script fails.
func (s sandbox) run(t *testing.T, tmpl *corev1.PodTemplateSpec) error {
	t.Helper()
	if tmpl == nil || len(tmpl.Spec.Containers) == 0 {
		t.Fatal("no pod template")
	}
	c := tmpl.Spec.Containers[0]
	if len(c.Command) != 3 || c.Command[0] != "sh" || c.Command[1] != "-c" {
		t.Fatalf("command %q, want sh -c <script>", c.Command)
	}
	for _, m := range c.VolumeMounts {
		if m.MountPath == lbDir {
			goto mounted
		}
	}
	t.Fatalf("container %s does not mount %s: %+v", c.Name, lbDir, c.VolumeMounts)
mounted:
	for _, f := range []string{"handle", "capacity", "maximumVolumeSize", "error"} {
		os.Remove(filepath.Join(s.pav, f))
	}
	script := strings.ReplaceAll(c.Command[2], lbDir, s.files)
	script = strings.ReplaceAll(script, "/pav/", s.pav+"/")
	cmd := exec.Command("sh", "-c", script)
	cmd.Env = append(os.Environ(), "NODE_NAME=node-1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		msg, _ := os.ReadFile(filepath.Join(s.pav, "error"))
		return &scriptError{err: err, out: string(out), pavError: string(msg)}
	}
	return nil
}

type scriptError struct {
	err           error
	out, pavError string
}

func (e *scriptError) Error() string {
	return e.err.Error() + ": /pav/error: " + e.pavError + "; output: " + e.out
}

func (s sandbox) pavFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.pav, name))
	if err != nil {
		t.Fatalf("/pav/%s: %v", name, err)
	}
	return strings.TrimSpace(string(b))
}

func (s sandbox) pavCapacity(t *testing.T) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s.pavFile(t, "capacity"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

func needTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found (apt-get install e2fsprogs coreutils): the scripts run it", tool)
		}
	}
}

func creationVars(t *testing.T, pvc *corev1.PersistentVolumeClaim, source map[string]any) templating.Vars {
	t.Helper()
	r := phase.FromClaim(phase.Request{VolumeMode: corev1.PersistentVolumeFilesystem, Params: map[string]string{}}, pvc)
	v, err := phase.CreationVars(r, phase.Objects{PVC: pvc}, "pvc-"+string(pvc.UID))
	if err != nil {
		t.Fatal(err)
	}
	v["source"] = source
	v["requisiteTopology"], v["preferredTopology"], v["selectedNode"] = []any{}, []any{}, nil
	return v
}

func snapshotVars(handle string, capacity int64, volumeMode string) templating.Vars {
	v := templating.Vars{
		"params": map[string]any{}, "snapshotName": lbSnap, "defaultHandle": lbSnap,
		"volume": map[string]any{"handle": lbHandle, "capacity": 64 * mib, "volumeMode": volumeMode, "params": map[string]any{}},
	}
	if handle != "" {
		v["handle"], v["capacity"] = handle, capacity
	}
	return v
}

// A Filesystem volume made, written, snapshotted, restored bigger, cloned and grown: every
// script's result is the files (and the ext4 in them) the design promises.
func TestLoopBlockCopiesAndGrowth(t *testing.T) {
	needTools(t, "mkfs.ext4", "e2fsck", "resize2fs", "debugfs", "truncate", "cp", "stat")
	ctx := context.Background()
	p := loopBlock(t)
	ev := phase.NewEvaluator(offlinePVCs{})
	for _, mode := range []corev1.PersistentVolumeMode{corev1.PersistentVolumeFilesystem, corev1.PersistentVolumeBlock} {
		t.Run(string(mode), func(t *testing.T) {
			s := newSandbox(t)
			src := filepath.Join(s.files, lbHandle+".img")
			// The source volume, 64Mi, with a file in its ext4 (or bytes on its device).
			pvc := lbClaim(t, mode, 64*mib)
			cfg, err := ev.Creation(ctx, p, creationVars(t, pvc, nil))
			if err != nil {
				t.Fatal(err)
			}
			if cfg.PodTemplate.Spec.NodeName != "" || *cfg.Capacity != 64*mib {
				t.Fatalf("plain creation: node %q capacity %d", cfg.PodTemplate.Spec.NodeName, *cfg.Capacity)
			}
			if err := s.run(t, cfg.PodTemplate); err != nil {
				t.Fatal(err)
			}
			if s.pavFile(t, "handle") != lbHandle || fileSize(t, src) != 64*mib {
				t.Fatalf("creation: handle %q, file %d bytes", s.pavFile(t, "handle"), fileSize(t, src))
			}
			writeData(t, mode, src, "original")

			// A snapshot: on the volume's node, a sparse copy under snapshots/, its handle
			// "<snapshot name>.<node>" and its size in /pav.
			sc, err := ev.SnapshotCreation(ctx, p, snapshotVars("", 0, string(mode)))
			if err != nil {
				t.Fatal(err)
			}
			if sc.PodTemplate.Spec.NodeName != "node-1" {
				t.Fatalf("snapshot pod on %q, want the volume's node-1", sc.PodTemplate.Spec.NodeName)
			}
			if err := s.run(t, sc.PodTemplate); err != nil {
				t.Fatal(err)
			}
			snapHandle := lbSnap + ".node-1"
			snapFile := filepath.Join(s.files, "snapshots", snapHandle+".img")
			if got := s.pavFile(t, "handle"); got != snapHandle || s.pavCapacity(t) != 64*mib || fileSize(t, snapFile) != 64*mib {
				t.Fatalf("snapshot: handle %q capacity %d", got, s.pavCapacity(t))
			}
			// Retried (a crashed pod), it keeps the copy it made: the source changed since.
			writeData(t, mode, src, "changed")
			if err := s.run(t, sc.PodTemplate); err != nil {
				t.Fatal(err)
			}
			wantData(t, mode, snapFile, "original")

			// A restore, bigger than the snapshot, and a clone of the (changed) volume.
			for _, c := range []struct {
				name, uid, kind, handle, want string
				size                          int64
			}{
				{"restore", "11111111-2222-4333-8444-555555555555", "Snapshot", snapHandle, "original", 96 * mib},
				{"clone", "66666666-7777-4888-9999-aaaaaaaaaaaa", "Volume", lbHandle, "changed", 64*mib + 100},
			} {
				pvc := lbClaim(t, mode, c.size)
				pvc.UID = types.UID(c.uid)
				source := map[string]any{"kind": c.kind, "handle": c.handle, "capacity": 64 * mib}
				if c.kind == "Snapshot" {
					source["volumeHandle"] = lbHandle
				}
				cfg, err := ev.Creation(ctx, p, creationVars(t, pvc, source))
				if err != nil {
					t.Fatal(err)
				}
				if cfg.PodTemplate.Spec.NodeName != "node-1" {
					t.Fatalf("%s pod on %q, want the source's node-1", c.name, cfg.PodTemplate.Spec.NodeName)
				}
				if err := s.run(t, cfg.PodTemplate); err != nil {
					t.Fatal(err)
				}
				handle := "pvc-" + c.uid + ".node-1"
				file := filepath.Join(s.files, handle+".img")
				rounded := (c.size + 511) / 512 * 512
				if s.pavFile(t, "handle") != handle || s.pavCapacity(t) != rounded || fileSize(t, file) != rounded {
					t.Fatalf("%s: handle %q, capacity %d, file %d bytes, want %s and %d", c.name, s.pavFile(t, "handle"), s.pavCapacity(t), fileSize(t, file), handle, rounded)
				}
				wantData(t, mode, file, c.want)
				if mode == corev1.PersistentVolumeFilesystem {
					wantFSFills(t, file)
				}
				if _, err := os.Stat(file + ".part"); !os.IsNotExist(err) {
					t.Fatalf("%s left %s.part", c.name, file)
				}
			}

			// A restore whose snapshot is gone fails, saying which file on which node.
			pvc = lbClaim(t, mode, 64*mib)
			pvc.UID = "bbbbbbbb-cccc-4ddd-8eee-ffffffffffff"
			cfg, err = ev.Creation(ctx, p, creationVars(t, pvc, map[string]any{"kind": "Snapshot", "handle": "snapshot-gone.node-1", "capacity": 64 * mib, "volumeHandle": lbHandle}))
			if err != nil {
				t.Fatal(err)
			}
			err = s.run(t, cfg.PodTemplate)
			if se, ok := err.(*scriptError); !ok || !strings.Contains(se.pavError, "no backing file") || !strings.Contains(se.pavError, "snapshot snapshot-gone.node-1") {
				t.Fatalf("restore of a missing snapshot: %v", err)
			}

			// Growth: 64Mi to 100Mi+1 (rounded up to a sector), never back down.
			for _, c := range []struct {
				requested, want int64
			}{{100*mib + 1, 100*mib + 512}, {80 * mib, 100*mib + 512}} {
				v, err := phase.DeletionVars(phase.FromClaim(phase.Request{Params: map[string]string{}}, pvc), phase.Objects{PVC: pvc}, "pvc-"+lbUID, lbHandle, fileSize(t, src))
				if err != nil {
					t.Fatal(err)
				}
				v["requestedCapacity"], v["requestedCapacityLimit"] = c.requested, nil
				ex, err := ev.Expansion(ctx, p, v)
				if err != nil {
					t.Fatal(err)
				}
				if !ex.Online || ex.PodTemplate.Spec.NodeName != "node-1" {
					t.Fatalf("expansion: online %v, pod on %q", ex.Online, ex.PodTemplate.Spec.NodeName)
				}
				if err := s.run(t, ex.PodTemplate); err != nil {
					t.Fatal(err)
				}
				if s.pavCapacity(t) != c.want || fileSize(t, src) != c.want {
					t.Fatalf("expansion to %d: /pav/capacity %d, file %d, want %d", c.requested, s.pavCapacity(t), fileSize(t, src), c.want)
				}
			}
			wantData(t, mode, src, "changed")

			// Snapshot deletion removes the copy (and is a no-op the second time).
			sd, err := ev.SnapshotDeletion(ctx, p, snapshotVars(snapHandle, 64*mib, string(mode)))
			if err != nil {
				t.Fatal(err)
			}
			if sd.PodTemplate.Spec.NodeName != "node-1" {
				t.Fatalf("snapshot deletion pod on %q", sd.PodTemplate.Spec.NodeName)
			}
			for range 2 {
				if err := s.run(t, sd.PodTemplate); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := os.Stat(snapFile); !os.IsNotExist(err) {
				t.Fatalf("snapshot deletion left %s", snapFile)
			}
		})
	}
}

// The node side, run for real on a loop device (root only): a staged volume whose file
// grew (what the volumeExpansion pod did) gets its loop device resized with losetup
// --set-capacity and, for a writable Filesystem volume, its mounted ext4 grown online by
// resize2fs on the device mounted at /pav/volume (the staging pod's mount) — or, where the
// kernel refuses that (no CAP_SYS_RESOURCE, as in this project's VMs), a failure that says
// so, and the staging pod grows the ext4 before mounting it when the volume is next staged.
// A read-only one grows its device only; a volume not attached on the node fails, saying so.
func TestLoopBlockNodeExpansion(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("attaches loop devices and mounts: needs root (CI runs as root)")
	}
	needTools(t, "losetup", "mkfs.ext4", "resize2fs", "findmnt", "mountpoint", "blockdev", "mount", "umount")
	ctx := context.Background()
	p := loopBlock(t)
	ev := phase.NewEvaluator(offlinePVCs{})
	for _, c := range []struct {
		mode     corev1.PersistentVolumeMode
		readOnly bool
		attached bool
		wantErr  string
	}{
		{corev1.PersistentVolumeFilesystem, false, true, ""},
		{corev1.PersistentVolumeFilesystem, true, true, ""},
		{corev1.PersistentVolumeBlock, false, true, ""},
		{corev1.PersistentVolumeBlock, false, false, "has no loop device on node node-1: it is not staged here"},
	} {
		t.Run(fmt.Sprintf("%s read-only=%v attached=%v", c.mode, c.readOnly, c.attached), func(t *testing.T) {
			v, err := phase.StagingVars(phase.Staged{VolumeMode: c.mode, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Capacity: 64 * mib, Params: map[string]string{}, Handle: lbHandle, ReadOnly: c.readOnly}, phase.Objects{})
			if err != nil {
				t.Fatal(err)
			}
			v["previousCapacity"] = 32 * mib
			cfg, err := ev.NodeExpansion(ctx, p, v)
			if err != nil {
				t.Fatal(err)
			}
			if ctr := cfg.PodTemplate.Spec.Containers[0]; !isPrivileged(ctr) || cfg.PodTemplate.Spec.NodeName != "" {
				t.Fatalf("node expansion pod privileged %v, node %q (pav puts it on the staging node)", isPrivileged(ctr), cfg.PodTemplate.Spec.NodeName)
			}

			// What staging left: the file attached and, for Filesystem, mounted at /pav/volume.
			s := newSandbox(t)
			file := filepath.Join(s.files, lbHandle+".img")
			if err := os.WriteFile(file, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(file, 32*mib); err != nil {
				t.Fatal(err)
			}
			if c.mode == corev1.PersistentVolumeFilesystem {
				mustRun(t, "mkfs.ext4", "-q", "-F", "-m", "0", file)
			}
			var dev string
			mnt := filepath.Join(s.pav, "volume")
			if c.attached {
				args := []string{"--find", "--show"}
				if c.readOnly {
					args = append(args, "--read-only")
				}
				dev = strings.TrimSpace(mustRun(t, "losetup", append(args, file)...))
				t.Cleanup(func() { _ = exec.Command("losetup", "--detach", dev).Run() })
				if c.mode == corev1.PersistentVolumeFilesystem {
					if err := os.Mkdir(mnt, 0o755); err != nil {
						t.Fatal(err)
					}
					opts := "rw"
					if c.readOnly {
						opts = "ro"
					}
					mustRun(t, "mount", "-t", "ext4", "-o", opts, dev, mnt)
					t.Cleanup(func() { _ = exec.Command("umount", mnt).Run() })
				}
			}
			before := fsBytes(t, c.mode, mnt)
			// The volumeExpansion pod's work.
			if err := os.Truncate(file, 64*mib); err != nil {
				t.Fatal(err)
			}

			err = s.run(t, cfg.PodTemplate)
			if c.mode == corev1.PersistentVolumeFilesystem && !c.readOnly && !hasCapSysResource(t) {
				// The kernel refuses online resize here: the failure says why and when the
				// ext4 grows instead; restaging grows it.
				if se, ok := err.(*scriptError); !ok || !strings.Contains(se.pavError, "online resize needs CAP_SYS_RESOURCE") {
					t.Fatalf("online resize without CAP_SYS_RESOURCE: got %v, want /pav/error to say why", err)
				}
				mustRun(t, "umount", mnt)
				mustRun(t, "losetup", "--detach", dev)
				restage(t, ev, p, s, v, file)
				if after := fsBytes(t, c.mode, mnt); after-before <= 24*mib {
					t.Fatalf("restaged after a refused online resize: the ext4 went from %d to %d bytes, want 32 MiB more", before, after)
				}
				return
			}
			if c.wantErr != "" {
				if se, ok := err.(*scriptError); !ok || !strings.Contains(se.pavError, c.wantErr) {
					t.Fatalf("got %v, want /pav/error to say %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSpace(mustRun(t, "blockdev", "--getsize64", dev)); got != strconv.FormatInt(64*mib, 10) {
				t.Fatalf("loop device %s is %s bytes after node expansion, want %d", dev, got, 64*mib)
			}
			after := fsBytes(t, c.mode, mnt)
			grew := after-before > 24*mib
			if want := c.mode == corev1.PersistentVolumeFilesystem && !c.readOnly; grew != want {
				t.Fatalf("the mounted ext4 went from %d to %d bytes: grown %v, want %v", before, after, grew, want)
			}
			if c.mode != corev1.PersistentVolumeFilesystem {
				return
			}
			// Unstaged and staged again (the staging pod's own script): a writable ext4 is
			// (still) the device's size, a read-only one is left as it was.
			mustRun(t, "umount", mnt)
			mustRun(t, "losetup", "--detach", dev)
			restage(t, ev, p, s, v, file)
			if after := fsBytes(t, c.mode, mnt); (after-before > 24*mib) != !c.readOnly {
				t.Fatalf("restaged read-only=%v: the ext4 went from %d to %d bytes", c.readOnly, before, after)
			}
		})
	}
}

// restage runs the staging pod's script for a volume (unstaged: no mount, no loop device)
// and leaves it to the test's cleanup to undo.
func restage(t *testing.T, ev *phase.Evaluator, p *v1alpha1.PavProvisioner, s sandbox, v templating.Vars, file string) {
	t.Helper()
	nv := templating.Vars{}
	for k, x := range v {
		nv[k] = x
	}
	node, err := phase.ObjectVar(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}})
	if err != nil {
		t.Fatal(err)
	}
	nv["node"] = node
	cfg, err := ev.Staging(context.Background(), p, nv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = exec.Command("umount", filepath.Join(s.pav, "volume")).Run()
		out, _ := exec.Command("losetup", "--noheadings", "--output", "NAME", "--associated", file).Output()
		for _, d := range strings.Fields(string(out)) {
			_ = exec.Command("losetup", "--detach", d).Run()
		}
	})
	if err := s.run(t, cfg.PodTemplate); err != nil {
		t.Fatalf("staging: %v", err)
	}
}

// hasCapSysResource tells whether this process may grow a mounted ext4 (the kernel's
// EXT4_IOC_RESIZE_FS wants CAP_SYS_RESOURCE, bit 24 of the effective set).
func hasCapSysResource(t *testing.T) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return caps&(1<<24) != 0
		}
	}
	t.Fatal("no CapEff in /proc/self/status")
	return false
}

func mustRun(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
	return string(out)
}

// fsBytes is the size of the file system mounted at mnt (0 for Block volumes).
func fsBytes(t *testing.T, mode corev1.PersistentVolumeMode, mnt string) int64 {
	t.Helper()
	if mode == corev1.PersistentVolumeBlock {
		return 0
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks) * st.Bsize
}

// writeData puts a marker in a volume's backing file: a file "data" in its ext4, or the
// first sector of its device.
func writeData(t *testing.T, mode corev1.PersistentVolumeMode, img, data string) {
	t.Helper()
	if mode == corev1.PersistentVolumeBlock {
		f, err := os.OpenFile(img, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteAt([]byte(data+"\n"), 0); err != nil {
			t.Fatal(err)
		}
		return
	}
	src := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(src, []byte(data+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// debugfs edits the ext4 without mounting it; "rm" fails harmlessly the first time.
	cmds := filepath.Join(t.TempDir(), "cmds")
	if err := os.WriteFile(cmds, []byte("rm data\nwrite "+src+" data\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("debugfs", "-w", "-f", cmds, img).CombinedOutput(); err != nil {
		t.Fatalf("debugfs write: %v: %s", err, out)
	}
	wantData(t, mode, img, data)
}

func wantData(t *testing.T, mode corev1.PersistentVolumeMode, img, want string) {
	t.Helper()
	var got string
	if mode == corev1.PersistentVolumeBlock {
		f, err := os.Open(img)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		b := make([]byte, len(want)+1)
		if _, err := f.ReadAt(b, 0); err != nil {
			t.Fatal(err)
		}
		got = string(b)
	} else {
		out, err := exec.Command("debugfs", "-R", "cat data", img).Output()
		if err != nil {
			t.Fatalf("debugfs cat: %v", err)
		}
		got = string(out)
	}
	if got != want+"\n" {
		t.Fatalf("%s holds %q, want %q", img, got, want+"\n")
	}
}

// wantFSFills checks that the ext4 in img spans the file, to within one block group's
// slack (resize2fs may leave a last group too small to hold its metadata).
func wantFSFills(t *testing.T, img string) {
	t.Helper()
	out, err := exec.Command("dumpe2fs", "-h", img).Output()
	if err != nil {
		t.Fatalf("dumpe2fs: %v", err)
	}
	field := func(name string) int64 {
		for _, l := range strings.Split(string(out), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && k == name {
				n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
		}
		t.Fatalf("dumpe2fs: no %q in\n%s", name, out)
		return 0
	}
	fs, size := field("Block count")*field("Block size"), fileSize(t, img)
	if fs > size || fs < size-mib {
		t.Fatalf("%s: ext4 of %d bytes in a file of %d: resize2fs did not grow it", img, fs, size)
	}
}

// usageDocs decodes every YAML document of an example's usage file, by kind.
func usageDocs(t *testing.T, file string) map[string][]map[string]any {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string][]map[string]any{}
	for _, d := range strings.Split(string(b), "\n---\n") {
		var m map[string]any
		if err := yaml.UnmarshalStrict([]byte(d), &m); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if m != nil {
			docs[m["kind"].(string)] = append(docs[m["kind"].(string)], m)
		}
	}
	return docs
}

// usage-snapshots.yaml fits usage.yaml and the provisioner: its objects are valid, the
// VolumeSnapshotClass is the driver's, the snapshot and the clone start from a claim of
// usage.yaml, the restore from the snapshot, each at least its source's size and in its
// mode; usage.yaml's StorageClass allows expansion.
func TestLoopBlockUsageSnapshots(t *testing.T) {
	base := usageDocs(t, "../../examples/loop-block/usage.yaml")
	snaps := usageDocs(t, "../../examples/loop-block/usage-snapshots.yaml")
	if sc := base["StorageClass"]; len(sc) != 1 || sc[0]["allowVolumeExpansion"] != true || sc[0]["provisioner"] != loopBlock(t).Name {
		t.Fatalf("usage.yaml's StorageClass: %v, want loop-block's with allowVolumeExpansion: true", sc)
	}
	claims := map[string]*corev1.PersistentVolumeClaim{}
	for _, m := range append(append([]map[string]any{}, base["PersistentVolumeClaim"]...), snaps["PersistentVolumeClaim"]...) {
		b, _ := yaml.Marshal(m)
		pvc := &corev1.PersistentVolumeClaim{}
		if err := yaml.UnmarshalStrict(b, pvc); err != nil {
			t.Fatal(err)
		}
		claims[pvc.Name] = pvc
	}
	for _, m := range snaps["Pod"] {
		b, _ := yaml.Marshal(m)
		if err := yaml.UnmarshalStrict(b, &corev1.Pod{}); err != nil {
			t.Fatal(err)
		}
	}
	if c := snaps["VolumeSnapshotClass"]; len(c) != 1 || c[0]["driver"] != "loop-block" || c[0]["deletionPolicy"] != "Delete" {
		t.Fatalf("VolumeSnapshotClass: %v", c)
	}
	vs := snaps["VolumeSnapshot"]
	if len(vs) != 1 {
		t.Fatalf("VolumeSnapshots: %v", vs)
	}
	spec := vs[0]["spec"].(map[string]any)
	snapName := vs[0]["metadata"].(map[string]any)["name"].(string)
	snapSource := claims[spec["source"].(map[string]any)["persistentVolumeClaimName"].(string)]
	if snapSource == nil || spec["volumeSnapshotClassName"] != snaps["VolumeSnapshotClass"][0]["metadata"].(map[string]any)["name"] {
		t.Fatalf("VolumeSnapshot spec %v: its claim and class must be in the files", spec)
	}
	kinds := map[string]bool{}
	for _, pvc := range claims {
		ds := pvc.Spec.DataSource
		if ds == nil {
			continue
		}
		kinds[ds.Kind] = true
		var src *corev1.PersistentVolumeClaim
		switch ds.Kind {
		case "VolumeSnapshot":
			if ds.APIGroup == nil || *ds.APIGroup != "snapshot.storage.k8s.io" || ds.Name != snapName {
				t.Fatalf("%s: dataSource %+v, want the VolumeSnapshot %s", pvc.Name, ds, snapName)
			}
			src = snapSource
		case "PersistentVolumeClaim":
			src = claims[ds.Name]
		}
		if src == nil {
			t.Fatalf("%s: dataSource %+v names nothing in the files", pvc.Name, ds)
		}
		want, got := src.Spec.Resources.Requests[corev1.ResourceStorage], pvc.Spec.Resources.Requests[corev1.ResourceStorage]
		if got.Cmp(want) < 0 || *pvc.Spec.VolumeMode != *src.Spec.VolumeMode || *pvc.Spec.StorageClassName != *src.Spec.StorageClassName {
			t.Fatalf("%s (%s, %s) from %s (%s, %s): Kubernetes wants at least the source's size, its mode and (here) its StorageClass",
				pvc.Name, got.String(), *pvc.Spec.VolumeMode, src.Name, want.String(), *src.Spec.VolumeMode)
		}
	}
	if !kinds["VolumeSnapshot"] || !kinds["PersistentVolumeClaim"] {
		t.Fatalf("usage-snapshots.yaml has a restore %v and a clone %v, want both", kinds["VolumeSnapshot"], kinds["PersistentVolumeClaim"])
	}
}
