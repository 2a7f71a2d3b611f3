//go:build linux

package hostmount

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pods-as-volumes/pav/internal/fakekubelet"
)

func TestBootID(t *testing.T) {
	a, err := BootID()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := BootID()
	if len(a) != 36 || a != b {
		t.Fatalf("boot IDs %q, %q: want one UUID", a, b)
	}
}

// TestIdentifyDirectory: a mount that goes away leaves the bare directory
// below it, which must never pass for the volume.
func TestIdentifyDirectory(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	v := filepath.Join(dir, "volume")
	if err := os.Mkdir(v, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = UnmountAll(dir) })
	bare := mustIdentify(t, v)
	if bare.MountRoot || bare.IsBlock() {
		t.Fatalf("a plain directory: %+v", bare)
	}
	if err := unix.Mount("tmpfs", v, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	mounted := mustIdentify(t, v)
	backend := filepath.Join(dir, "backend")
	if err := os.Mkdir(backend, 0o755); err != nil {
		t.Fatal(err)
	}
	bound := filepath.Join(dir, "bound")
	if err := os.Mkdir(bound, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Bind(backend, bound, false); err != nil {
		t.Fatal(err)
	}
	bind := mustIdentify(t, bound)
	if !bind.MountRoot {
		t.Fatalf("a bind mount is a mount root: %+v", bind)
	}
	for _, tc := range []struct {
		name     string
		rec, cur Identity
		want     string
	}{
		{"mounted over since", bare, mustIdentify(t, v), "something was mounted over it"},
		{"same mount", mounted, mustIdentify(t, v), ""},
		{"mount gone", mounted, bare, "no longer a mount point"},
		{"another mount", mounted, Identity{Dev: mounted.Dev + 1, Ino: mounted.Ino, MountRoot: true}, "now another directory"},
		{"a block device now", mounted, Identity{Rdev: 7}, "no longer a directory"},
		{"bind of the same backend", bind, mustIdentify(t, bound), ""},
		{"plain", bare, bare, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.rec.Compare(tc.cur); tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
				t.Fatalf("Compare = %q, want %q", got, tc.want)
			}
		})
	}
	if err := Unmount(v); err != nil {
		t.Fatal(err)
	}
	if got := mounted.Compare(mustIdentify(t, v)); !strings.Contains(got, "no longer a mount point") {
		t.Fatalf("after unmount: %q", got)
	}
}

// TestIdentifyLoopDevice: a device node keeps naming a loop minor after the
// loop is detached, and the minor may go to another file: the disk sequence
// number tells.
func TestIdentifyLoopDevice(t *testing.T) {
	needRoot(t)
	if _, err := exec.LookPath("losetup"); err != nil {
		t.Skip("needs losetup")
	}
	dir := t.TempDir()
	attach := func(name string, size int64, dev string) string {
		t.Helper()
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(f, size); err != nil {
			t.Fatal(err)
		}
		args := []string{"--find", "--show", f}
		if dev != "" {
			args = []string{dev, f}
		}
		out, err := exec.Command("losetup", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("losetup %v: %v: %s", args, err, out)
		}
		if dev == "" {
			dev = strings.TrimSpace(string(out))
		}
		t.Cleanup(func() { fakekubelet.DetachFile(f) })
		return dev
	}
	dev := attach("a.img", 1<<20, "")
	node := filepath.Join(dir, "volume")
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(node, unix.S_IFBLK|0o600, int(st.Rdev)); err != nil {
		t.Fatal(err)
	}
	rec := mustIdentify(t, node)
	if !rec.IsBlock() || rec.Size != 1<<20 || rec.Rdev != st.Rdev || !strings.HasSuffix(rec.BackingFile, "a.img") {
		t.Fatalf("identity %+v", rec)
	}
	if got := rec.Compare(mustIdentify(t, node)); got != "" {
		t.Fatalf("same device: %q", got)
	}
	if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
		t.Fatalf("losetup -d: %v: %s", err, out)
	}
	detached, err := Identify(node)
	if err == nil {
		if got := rec.Compare(detached); got == "" {
			t.Fatalf("a detached loop device passes for the volume: %+v", detached)
		}
	}
	// Another volume's file on the same minor, of the same size.
	attach("b.img", 1<<20, dev)
	other := mustIdentify(t, node)
	got := rec.Compare(other)
	if rec.Diskseq != 0 && (!strings.Contains(got, "detached or attached again") || !strings.Contains(got, "b.img")) {
		t.Fatalf("another file on the minor: %q (%+v)", got, other)
	}
	if got == "" {
		t.Fatalf("another file on the same loop minor passes for the volume: %+v", other)
	}
}

func mustIdentify(t *testing.T, p string) Identity {
	t.Helper()
	id, err := Identify(p)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
