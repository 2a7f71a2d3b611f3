package fakekubelet

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// AttachLoop does what a privileged staging pod of a Block volume does: it
// attaches a loop device over a sparse file of size bytes in pavDir and makes
// pavDir/volume a block special file for it. It returns the device, for
// `losetup -d` when the volume is unstaged. Needs root and losetup.
func AttachLoop(pavDir string, size int64) (string, error) {
	img := filepath.Join(pavDir, "backing.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		return "", err
	}
	if err := os.Truncate(img, size); err != nil {
		return "", err
	}
	out, err := exec.Command("losetup", "--find", "--show", img).Output()
	if err != nil {
		return "", fmt.Errorf("losetup: %w", err)
	}
	dev := strings.TrimSpace(string(out))
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return dev, err
	}
	return dev, unix.Mknod(filepath.Join(pavDir, "volume"), unix.S_IFBLK|0o600, int(st.Rdev))
}

// GrowLoop does what a privileged node expansion pod of a Block volume does
// with the loop device AttachLoop made in pavDir: it grows the backing file to
// size bytes and has the kernel read the new size (losetup -c, on
// pavDir/volume, the device's special file), so that the device keeps its
// number and disk sequence number, as the files that publish it need. Needs
// root and losetup.
func GrowLoop(pavDir string, size int64) error {
	if err := os.Truncate(filepath.Join(pavDir, "backing.img"), size); err != nil {
		return err
	}
	if out, err := exec.Command("losetup", "--set-capacity", filepath.Join(pavDir, "volume")).CombinedOutput(); err != nil {
		return fmt.Errorf("losetup --set-capacity: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// DetachFile detaches every loop device whose backing file is path, even once
// path was removed (the device keeps the inode; losetup then lists the path
// with " (deleted)"): a test's clean-up that names its file, not a device
// number, never detaches a device that another test (or package, running at
// the same time) attached since, and leaves none of its own.
func DetachFile(path string) {
	out, err := exec.Command("losetup", "--noheadings", "--list", "--output", "NAME,BACK-FILE").Output()
	if err != nil {
		return
	}
	for _, l := range strings.Split(string(out), "\n") {
		dev, back, ok := strings.Cut(strings.TrimSpace(l), " ")
		if ok && strings.TrimSuffix(strings.TrimSpace(back), " (deleted)") == path {
			_ = exec.Command("losetup", "-d", dev).Run()
		}
	}
}
