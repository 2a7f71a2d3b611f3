//go:build linux

package hostmount

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// bootIDFile changes at every boot of the kernel; it is not namespaced, so a
// node plugin in a container reads the node's.
const bootIDFile = "/proc/sys/kernel/random/boot_id"

// BootID returns the node's boot ID: the same value until the node reboots.
func BootID() (string, error) {
	b, err := os.ReadFile(bootIDFile)
	if err != nil {
		return "", fmt.Errorf("reading the boot ID: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// BootTime returns when the node booted (btime of /proc/stat, whole seconds):
// a file written after it was written during this boot.
func BootTime() (time.Time, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}, fmt.Errorf("reading the boot time: %w", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "btime "); ok {
			sec, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return time.Time{}, fmt.Errorf("reading the boot time: /proc/stat btime %q: %w", v, err)
			}
			return time.Unix(sec, 0), nil
		}
	}
	return time.Time{}, errors.New("reading the boot time: /proc/stat has no btime line")
}

// Identity is what a staged volume's path resolved to, recorded at staging
// and compared later (Compare) to tell that it is no longer the same thing:
// a mount that went away (a reboot, a dead FUSE daemon) leaves the bare
// directory below it, and a device node keeps naming a device number that may
// since have been detached, or given to another volume.
//
// Everything in it is the same in every mount namespace, so that a restarted
// node plugin (a new container, a new mount namespace) compares equal: mount
// IDs are not (each namespace numbers its copies of the mounts), which is why
// a mount is known by its st_dev, st_ino and "is the root of a mount" instead.
type Identity struct {
	// Directory: st_dev and st_ino of the directory, and whether it is the root
	// of a mount (statx STATX_ATTR_MOUNT_ROOT: a file system or a bind mount
	// made at that path).
	Dev       uint64 `json:"dev,omitempty"`
	Ino       uint64 `json:"ino,omitempty"`
	MountRoot bool   `json:"mountRoot,omitempty"`

	// Block device: its device number, size in bytes, and disk sequence number
	// (/sys/dev/block/MAJ:MIN/diskseq, Linux ≥ 5.15: unique to one attachment
	// of a medium until the next boot, so a loop device detached and attached
	// again, by anyone, has a new one; 0 where the kernel has none).
	Rdev    uint64 `json:"rdev,omitempty"`
	Size    int64  `json:"size,omitempty"`
	Diskseq uint64 `json:"diskseq,omitempty"`
	// BackingFile of a loop device, as the node plugin's mount namespace names
	// it. Only for messages: the name depends on the namespace of the reader,
	// and Diskseq already tells a re-attachment.
	BackingFile string `json:"backingFile,omitempty"`
}

// IsBlock says whether the identity is a block device's.
func (id *Identity) IsBlock() bool { return id.Rdev != 0 }

// Identify returns the identity of a directory or block device at path.
func Identify(path string) (Identity, error) {
	var stx unix.Statx_t
	mask := unix.STATX_TYPE | unix.STATX_INO
	if err := unix.Statx(unix.AT_FDCWD, path, 0, mask, &stx); err != nil {
		return Identity{}, &os.PathError{Op: "statx", Path: path, Err: err}
	}
	switch stx.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		id := Identity{Dev: unix.Mkdev(stx.Dev_major, stx.Dev_minor), Ino: stx.Ino}
		if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 {
			id.MountRoot = stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
		} else if mp, err := IsMountPoint(path); err == nil {
			// Kernels before 5.8 do not say; mountinfo does.
			id.MountRoot = mp
		} else {
			return Identity{}, err
		}
		return id, nil
	case unix.S_IFBLK:
		id := Identity{Rdev: unix.Mkdev(stx.Rdev_major, stx.Rdev_minor)}
		size, err := BlockSize(path)
		if err != nil {
			return Identity{}, err
		}
		id.Size = size
		sys := fmt.Sprintf("/sys/dev/block/%d:%d", stx.Rdev_major, stx.Rdev_minor)
		if b, err := os.ReadFile(filepath.Join(sys, "diskseq")); err == nil {
			if id.Diskseq, err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err != nil {
				return Identity{}, fmt.Errorf("%s/diskseq: %w", sys, err)
			}
		} else if !errors.Is(err, os.ErrNotExist) {
			return Identity{}, err
		}
		if b, err := os.ReadFile(filepath.Join(sys, "loop", "backing_file")); err == nil {
			id.BackingFile = strings.TrimSpace(string(b))
		}
		return id, nil
	}
	return Identity{}, fmt.Errorf("%s is neither a directory nor a block device", path)
}

// Compare says how cur differs from the recorded identity, or "" if it is the
// same thing.
func (rec *Identity) Compare(cur Identity) string {
	switch {
	case rec.IsBlock() != cur.IsBlock():
		if rec.IsBlock() {
			return "it is no longer a block device"
		}
		return "it is no longer a directory"
	case rec.IsBlock() && rec.Rdev != cur.Rdev:
		return fmt.Sprintf("it is now device %s, not %s", devName(cur.Rdev), devName(rec.Rdev))
	case rec.IsBlock() && rec.Diskseq != cur.Diskseq:
		what := fmt.Sprintf("device %s was detached or attached again since (disk sequence number %d, was %d)",
			devName(cur.Rdev), cur.Diskseq, rec.Diskseq)
		if cur.BackingFile != "" && cur.BackingFile != rec.BackingFile {
			what += "; it now serves " + cur.BackingFile
		} else if cur.Size == 0 {
			what += "; it is now empty"
		}
		return what
	case rec.IsBlock() && rec.Size != cur.Size:
		return fmt.Sprintf("device %s is now %d bytes, not %d", devName(cur.Rdev), cur.Size, rec.Size)
	case rec.IsBlock():
		return ""
	case rec.MountRoot && !cur.MountRoot:
		return "it is no longer a mount point: what was mounted there is gone, and only the bare directory below is left"
	case !rec.MountRoot && cur.MountRoot:
		return "something was mounted over it since"
	case rec.Dev != cur.Dev || rec.Ino != cur.Ino:
		return fmt.Sprintf("it is now another directory (device %s inode %d, was device %s inode %d)",
			devName(cur.Dev), cur.Ino, devName(rec.Dev), rec.Ino)
	}
	return ""
}

func devName(d uint64) string { return fmt.Sprintf("%d:%d", unix.Major(d), unix.Minor(d)) }
