//go:build linux

// Package hostmount holds the few mount operations the node plugin performs on
// the host (bind mounts, unmounts, mount-point checks) and the safe resolution of
// paths a staging pod wrote, so that the node server's logic stays testable.
package hostmount

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Bind bind-mounts src on dst (recursively, so that mounts a FUSE daemon made
// below src come along) and makes it read-only when asked: a read-only bind needs
// a second, remounting call.
func Bind(src, dst string, readOnly bool) error {
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind mount %s on %s: %w", src, dst, err)
	}
	if readOnly {
		if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			_ = unix.Unmount(dst, unix.MNT_DETACH)
			return fmt.Errorf("remount %s read-only: %w", dst, err)
		}
	}
	return nil
}

// IsMountPoint reports whether path is a mount point, from mountinfo: comparing
// st_dev with the parent misses bind mounts from the same file system.
func IsMountPoint(path string) (bool, error) {
	path, err := filepath.Abs(path)
	if err != nil {
		return false, err
	}
	mps, err := mountPoints()
	if err != nil {
		return false, err
	}
	for _, mp := range mps {
		if mp == path {
			return true, nil
		}
	}
	return false, nil
}

// Unmount removes every mount stacked on path; a path that is not mounted (or
// does not exist) is fine.
func Unmount(path string) error {
	for i := 0; i < 16; i++ {
		mounted, err := IsMountPoint(path)
		if err != nil || !mounted {
			return err
		}
		if err := unix.Unmount(path, 0); err != nil {
			if errors.Is(err, unix.EBUSY) {
				// Still in use (a process with its cwd inside): detach it so the
				// volume goes away as soon as the last user does.
				err = unix.Unmount(path, unix.MNT_DETACH)
			}
			if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("unmount %s: %w", path, err)
			}
		}
	}
	return fmt.Errorf("unmount %s: still mounted after 16 unmounts", path)
}

// UnmountAll detaches every mount at or below root, deepest first, so that a
// directory can be removed without leaking a mount a staging pod left behind.
func UnmountAll(root string) error {
	root, err := filepath.Abs(root)
	if err != nil {
		return err
	}
	for i := 0; i < 64; i++ {
		mps, err := mountPoints()
		if err != nil {
			return err
		}
		var under []string
		for _, mp := range mps {
			if mp == root || strings.HasPrefix(mp, root+"/") {
				under = append(under, mp)
			}
		}
		if len(under) == 0 {
			return nil
		}
		sort.Slice(under, func(i, j int) bool { return len(under[i]) > len(under[j]) })
		for _, mp := range under {
			if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("unmount %s: %w", mp, err)
			}
		}
	}
	return fmt.Errorf("mounts under %s keep coming back", root)
}

// PathsNaming lists the paths (mount points, say) that have name as one of
// their elements: the kubelet's targets for a PV's publications
// (pods/UID/volumes/kubernetes.io~csi/PV/mount, and
// plugins/kubernetes.io/csi/volumeDevices/publish/PV/UID for Block) do.
func PathsNaming(paths []string, name string) []string {
	var out []string
	for _, p := range paths {
		if strings.HasSuffix(p, "/"+name) || strings.Contains(p, "/"+name+"/") {
			out = append(out, p)
		}
	}
	return out
}

// MountPoints lists this mount namespace's mount points.
func MountPoints() ([]string, error) { return mountPoints() }

// A Mount is a line of mountinfo: where, and the file system's device.
type Mount struct {
	Path string // the mount point, unescaped
	Dev  string // "major:minor" of the mounted file system: every bind of one file system has its own
}

// Mounts lists this mount namespace's mounts.
func Mounts() ([]Mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseMountInfo(f)
}

// mountPoints lists this mount namespace's mount points, unescaped.
func mountPoints() ([]string, error) {
	ms, err := Mounts()
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Path
	}
	return out, err
}

// parseMountInfo reads /proc/PID/mountinfo's format (proc(5)): "ID PARENT
// MAJOR:MINOR ROOT MOUNTPOINT …".
func parseMountInfo(r io.Reader) ([]Mount, error) {
	var out []Mount
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		out = append(out, Mount{Path: unescapeOctal(fields[4]), Dev: fields[2]})
	}
	return out, sc.Err()
}

// unescapeOctal undoes mountinfo's \040-style escaping of spaces, tabs, newlines
// and backslashes.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Resolve maps a path as a pod sees it under mountPath (e.g. /pav/volume) to the
// host path under root (the hostPath directory behind mountPath), following
// symlinks the way the pod would see them, and refuses anything that leaves
// root: a staging pod must not make the node plugin expose a host path of its
// choosing.
func Resolve(root, mountPath, podPath string) (string, error) {
	if podPath != mountPath && !strings.HasPrefix(podPath, mountPath+"/") {
		return "", fmt.Errorf("%s is not inside %s", podPath, mountPath)
	}
	rest := strings.TrimPrefix(podPath, mountPath)
	pending := splitPath(rest)
	var resolved []string // components below root, all already resolved
	links := 0
	for len(pending) > 0 {
		c := pending[0]
		pending = pending[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(resolved) == 0 {
				return "", fmt.Errorf("%s leads outside %s", podPath, mountPath)
			}
			resolved = resolved[:len(resolved)-1]
			continue
		}
		host := filepath.Join(append([]string{root}, append(resolved, c)...)...)
		fi, err := os.Lstat(host)
		if err != nil {
			return "", err
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			resolved = append(resolved, c)
			continue
		}
		if links++; links > 40 {
			return "", fmt.Errorf("%s: too many levels of symbolic links", podPath)
		}
		target, err := os.Readlink(host)
		if err != nil {
			return "", err
		}
		if filepath.IsAbs(target) {
			if target != mountPath && !strings.HasPrefix(target, mountPath+"/") {
				return "", fmt.Errorf("%s is a symbolic link to %s, outside %s", podPath, target, mountPath)
			}
			resolved = nil
			target = strings.TrimPrefix(target, mountPath)
		}
		pending = append(splitPath(target), pending...)
	}
	return filepath.Join(append([]string{root}, resolved...)...), nil
}

func splitPath(p string) []string { return strings.Split(strings.Trim(p, "/"), "/") }

// BlockSize returns the size in bytes of a block device.
func BlockSize(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var size uint64
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&size))); errno != 0 {
		return 0, fmt.Errorf("BLKGETSIZE64 on %s: %w", path, errno)
	}
	return int64(size), nil
}

// FSUsage is what statfs says of a file system.
type FSUsage struct {
	Bytes, BytesFree, Inodes, InodesFree int64
}

// Usage returns the usage of the file system holding path; free space is what
// an unprivileged writer can still use (f_bavail).
func Usage(path string) (FSUsage, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return FSUsage{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	bs := int64(st.Bsize)
	return FSUsage{Bytes: int64(st.Blocks) * bs, BytesFree: int64(st.Bavail) * bs, Inodes: int64(st.Files), InodesFree: int64(st.Ffree)}, nil
}

// RemoveAll removes root and everything below it, like os.RemoveAll, but
// never goes through a mount: a mount left below root (a staging pod's bind
// of a backend directory, say, had an unmount been missed) would otherwise
// have the backend's files deleted. It refuses, naming the mount, and removes
// nothing below it.
func RemoveAll(root string) error {
	var st unix.Stat_t
	if err := unix.Lstat(root, &st); errors.Is(err, unix.ENOENT) {
		return nil
	} else if err != nil {
		return &os.PathError{Op: "lstat", Path: root, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return os.Remove(root)
	}
	if err := refuseMount(root, st.Dev); err != nil {
		return err
	}
	return removeTree(root, st.Dev)
}

// refuseMount fails if dir is on another device than dev, or the root of a
// mount (a bind mount within one file system keeps its st_dev).
func refuseMount(dir string, dev uint64) error {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, dir, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_TYPE, &stx); err != nil {
		return &os.PathError{Op: "statx", Path: dir, Err: err}
	}
	mountRoot := stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
	if mountRoot || unix.Mkdev(stx.Dev_major, stx.Dev_minor) != dev {
		return fmt.Errorf("not removing %s: it is a mount point (unmount it first)", dir)
	}
	return nil
}

func removeTree(dir string, dev uint64) error {
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if e.IsDir() {
			if err := refuseMount(p, dev); err != nil {
				return err
			}
			if err := removeTree(p, dev); err != nil {
				return err
			}
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
