//go:build linux

package hostmount

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mount tests need root (CI runs as root)")
	}
}

func TestBindReadOnlyAndUnmount(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	for _, d := range []string{src, dst} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Bind(src, dst, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = UnmountAll(dir) })
	if mp, err := IsMountPoint(dst); err != nil || !mp {
		t.Fatalf("IsMountPoint(dst) = %v, %v; want true", mp, err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "f")); err != nil || string(b) != "hello" {
		t.Fatalf("read through bind mount: %q, %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(dst, "g"), nil, 0o644); err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("write on read-only bind mount: err = %v, want read-only file system", err)
	}
	if err := Unmount(dst); err != nil {
		t.Fatal(err)
	}
	if mp, _ := IsMountPoint(dst); mp {
		t.Fatal("still mounted after Unmount")
	}
	if err := Unmount(dst); err != nil {
		t.Fatalf("second Unmount must be a no-op: %v", err)
	}
}

func TestUnmountAllNested(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	a := filepath.Join(dir, "a")
	b := filepath.Join(a, "b")
	if err := os.MkdirAll(a, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", a, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", b, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	if err := UnmountAll(dir); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{a, b} {
		if mp, _ := IsMountPoint(p); mp {
			t.Fatalf("%s still mounted", p)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
}

func TestResolve(t *testing.T) {
	root := t.TempDir()
	mk := func(p string) {
		if err := os.MkdirAll(filepath.Join(root, p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ln := func(target, p string) {
		if err := os.Symlink(target, filepath.Join(root, p)); err != nil {
			t.Fatal(err)
		}
	}
	mk("data/real")
	ln("/pav/data/real", "abs")
	ln("data/real", "rel")
	ln("/etc", "escape-abs")
	ln("../../..", "escape-rel")
	ln("loop2", "loop1")
	ln("loop1", "loop2")
	ln("/pav/abs", "chain")
	for _, tc := range []struct {
		in, want, wantErr string
	}{
		{in: "/pav/data/real", want: "data/real"},
		{in: "/pav/abs", want: "data/real"},
		{in: "/pav/rel", want: "data/real"},
		{in: "/pav/chain", want: "data/real"},
		{in: "/pav/data/../data/real", want: "data/real"},
		{in: "/pav/escape-abs", wantErr: "outside /pav"},
		{in: "/pav/escape-rel", wantErr: "leads outside"},
		{in: "/pav/loop1", wantErr: "too many levels"},
		{in: "/pav/missing", wantErr: "no such file"},
		{in: "/etc/passwd", wantErr: "not inside"},
	} {
		got, err := Resolve(root, "/pav", tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Resolve(%s) = %q, %v; want error %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != filepath.Join(root, tc.want) {
			t.Errorf("Resolve(%s) = %q, %v; want %s", tc.in, got, err, tc.want)
		}
	}
}

func TestUnescapeOctal(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", `/plain`: "/plain", `/x\134y`: `/x\y`, `/end\04`: `/end\04`} {
		if got := unescapeOctal(in); got != want {
			t.Errorf("unescapeOctal(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestRemoveAllNeverCrossesAMount: a mount left in a directory being removed
// keeps its files; the rest goes once it is unmounted.
func TestRemoveAllNeverCrossesAMount(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	backend, victim := filepath.Join(dir, "backend"), filepath.Join(dir, "vol")
	mp := filepath.Join(victim, "pav", "volume")
	for _, d := range []string{backend, mp} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(backend, "data"), []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(victim, "state.json"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = UnmountAll(dir) })
	for name, mount := range map[string]func() error{
		"bind mount":  func() error { return Bind(backend, mp, false) },
		"file system": func() error { return unix.Mount("tmpfs", mp, "tmpfs", 0, "size=1m") },
	} {
		t.Run(name, func(t *testing.T) {
			if err := mount(); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(mp, "inside"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			err := RemoveAll(victim)
			if err == nil || !strings.Contains(err.Error(), "mount point") {
				t.Fatalf("RemoveAll through a mount: %v", err)
			}
			if _, err := os.Stat(filepath.Join(mp, "inside")); err != nil {
				t.Fatalf("a file inside the mount was removed: %v", err)
			}
			if err := RemoveAll(mp); err == nil {
				t.Fatal("RemoveAll of a mount point itself succeeded")
			}
			if err := Unmount(mp); err != nil {
				t.Fatal(err)
			}
		})
	}
	if b, err := os.ReadFile(filepath.Join(backend, "data")); err != nil || string(b) != "precious" {
		t.Fatalf("backend data: %q, %v", b, err)
	}
	if err := RemoveAll(victim); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(victim); !os.IsNotExist(err) {
		t.Fatalf("not removed: %v", err)
	}
	if err := RemoveAll(victim); err != nil {
		t.Fatalf("removing what is gone: %v", err)
	}
}

func TestPathsNaming(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	targets := map[string]bool{ // mount point → names pvc-1
		filepath.Join(dir, "pods", "uid", "volumes", "kubernetes.io~csi", "pvc-1", "mount"):  true,
		filepath.Join(dir, "publish", "pvc-1"):                                               true,
		filepath.Join(dir, "pods", "uid", "volumes", "kubernetes.io~csi", "pvc-10", "mount"): false,
		filepath.Join(dir, "xpvc-1"):                                                         false,
	}
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = UnmountAll(dir) })
	for mp := range targets {
		if err := os.MkdirAll(mp, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := Bind(src, mp, false); err != nil {
			t.Fatal(err)
		}
	}
	mps, err := MountPoints()
	if err != nil {
		t.Fatal(err)
	}
	got := PathsNaming(mps, "pvc-1")
	found := map[string]bool{}
	for _, mp := range got {
		found[mp] = true
	}
	for mp, want := range targets {
		if found[mp] != want {
			t.Errorf("%s listed: %v, want %v (all: %v)", mp, found[mp], want, got)
		}
	}
}

func TestParseMountInfo(t *testing.T) {
	in := `22 1 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw
512 30 0:77 /sub/dir /var/lib/kubelet/pods/u/volume-subpaths/my\040vol/c/0 rw,relatime shared:300 - fuse.gocryptfs /dev/fuse rw
short line
`
	got, err := parseMountInfo(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []Mount{{Path: "/sys", Dev: "0:21"}, {Path: "/var/lib/kubelet/pods/u/volume-subpaths/my vol/c/0", Dev: "0:77"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}
