package report

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// forwardedSignals are passed on to the user's command by Exec: what the
// kubelet (SIGTERM on deletion) or someone at a terminal may send a
// container's first process. SIGURG is left out on purpose: Go's runtime
// sends it to itself to preempt goroutines.
var forwardedSignals = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH}

// reapWait bounds how long Exec, as a container's first process, waits for
// the processes its command left behind to die once it has killed them.
const reapWait = 5 * time.Second

// Exec is pav-report's other form, `pav-report --exec -- COMMAND [ARG...]`: it
// runs the user's command as its child in the user's own container (pav
// mounts pav-report there from an image volume), and once the child has
// exited it writes the report of dir to terminationLog, as the report sidecar
// would, and exits with the child's code (128+N for a child killed by signal
// N). So a controller-side pod whose one container is wrapped needs no report
// sidecar, and the kubelet none of the two relists a sidecar costs it (one to
// see it started before the user's containers start, one to see it stopped
// after they end).
//
// It stands in for the command as the container's first process: it forwards
// the signals a container's first process gets to the child and, as PID 1,
// reaps the orphans reparented to it. When the child exits it kills whatever
// the command left running (as the end of the container's first process
// would), so that the files it reads are the command's last word. A command
// that cannot be started exits 127 (not found) or 126, as a shell's does, and
// says why on stderr, which the driver shows as the pod's log tail.
func Exec(argv []string, dir, terminationLog string, maxBytes int) int {
	return ExecWith(argv, dir, terminationLog, maxBytes, nil)
}

// ExecWith is Exec that, once the command has ended and what it left running
// is killed, prints the files logFiles names to stdout, the container's log
// (PrintLogFiles), and reports where they are: nothing of the command's can
// write to the log any more.
func ExecWith(argv []string, dir, terminationLog string, maxBytes int, logFiles []string) int {
	return ExecEnded(argv, dir, terminationLog, maxBytes, logFiles, "")
}

// ExecEnded is ExecWith that, when the command has exited 0 and its report is
// in terminationLog, also writes the report to endedFile (if set;
// /pav/.pav-ended), atomically: the node plugin of the pod's node sees it at
// once through inotify and relays it to the driver, a kubelet relist (up to
// 1 s) before the pod's status would carry it. Only a success is copied: a
// failure waits for the pod's status, which says why.
func ExecEnded(argv []string, dir, terminationLog string, maxBytes int, logFiles []string, endedFile string) int {
	if dir == "" {
		dir = Dir
	}
	code := run(argv)
	if os.Getpid() == 1 {
		killRest()
	}
	msg, ok := writeMessage(dir, terminationLog, maxBytes, logFiles)
	if !ok && code == 0 {
		code = 1 // a success without its report would lose the handle
	}
	if code == 0 && endedFile != "" {
		if err := writeAtomic(endedFile, []byte(msg)); err != nil {
			// The pod's status still carries the report.
			fmt.Fprintf(os.Stderr, "pav-report: copying the report for the node plugin: %v\n", err)
		}
	}
	return code
}

// ExecNode is Exec for a node pod (a staging pod), whose /pav is a directory
// of the node plugin's, which reads its files itself: no report is written. Once the command has ended (and, as PID 1, what it left
// running is killed), its exit code goes to exitFile (/pav/.pav-exit), where
// the node plugin's inotify watch sees it at once; the pod's own status would
// reach the node plugin only after the kubelet's next relist (up to its 1 s
// period) and a status update. It exits with the command's code, so the pod's
// status, which comes later, says the same.
func ExecNode(argv []string, exitFile string) int {
	code := run(argv)
	if os.Getpid() == 1 {
		killRest()
	}
	if err := WriteExit(exitFile, code); err != nil {
		fmt.Fprintf(os.Stderr, "pav-report: %v\n", err)
	}
	return code
}

// WriteExit writes code to path as one line, atomically (a temporary file
// beside it, then a rename), so that a reader never sees half of it.
func WriteExit(path string, code int) error {
	if err := writeAtomic(path, []byte(strconv.Itoa(code)+"\n")); err != nil {
		return fmt.Errorf("writing the exit code: %w", err)
	}
	return nil
}

// writeAtomic writes b to path through a temporary file beside it and a
// rename, so that a reader (or an inotify watch) never sees half of it.
func writeAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ReadEnded reads the report ExecEnded copied to dir/.pav-ended: ok is false
// while there is none, or what is there cannot be one (the file is read under
// the report's rules: no symlink, regular, at most MaxMessage bytes; the
// command may have put anything there).
func ReadEnded(dir string) (msg string, ok bool) {
	s, err := readReportFile(filepath.Join(dir, FileEnded), MaxMessage, false)
	if err != nil {
		return "", false
	}
	if _, err := Parse(s); err != nil {
		return "", false
	}
	return s, true
}

// ReadExit reads the exit code ExecNode wrote in dir: ok is false while there
// is none, or what is there is not one (a file the command itself put there
// is read under the same rules as the report's: no symlink, regular, small).
func ReadExit(dir string) (code int, ok bool) {
	s, err := readReportFile(filepath.Join(dir, FileExit), 16, false)
	if err != nil {
		return 0, false
	}
	code, err = strconv.Atoi(strings.TrimSpace(s))
	return code, err == nil
}

// run starts argv, forwards signals to it until it exits, and returns its exit code.
func run(argv []string) int {
	if len(argv) == 0 {
		fmt.Fprintln(os.Stderr, "pav-report: --exec needs a command after --")
		return 2
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, forwardedSignals...)
	defer signal.Stop(sigs)

	path, err := exec.LookPath(argv[0])
	if errors.Is(err, exec.ErrDot) {
		// Found through a relative entry of PATH: runc would run it too.
		err = nil
	}
	var p *os.Process
	if err == nil {
		p, err = os.StartProcess(path, argv, &os.ProcAttr{Env: os.Environ(), Files: []*os.File{os.Stdin, os.Stdout, os.Stderr}})
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "pav-report: cannot run %q: %v\n", argv[0], err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return 127
		}
		return 126
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case s := <-sigs:
				_ = p.Signal(s)
			case <-done:
				return
			}
		}
	}()
	// As PID 1 the orphans are ours to reap too, so wait for any child there;
	// elsewhere (a test, a shared PID namespace) only for our own.
	target := p.Pid
	if os.Getpid() == 1 {
		target = -1
	}
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(target, &ws, 0, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case err != nil:
			// ECHILD while our child lives cannot happen; say so rather than hang.
			fmt.Fprintf(os.Stderr, "pav-report: waiting for %q: %v\n", argv[0], err)
			return 1
		case pid != p.Pid:
			continue
		case ws.Signaled():
			return 128 + int(ws.Signal())
		default:
			return ws.ExitStatus()
		}
	}
}

// killRest kills every other process of the container's PID namespace and
// reaps them, within reapWait. Only for PID 1: kill(-1) anywhere else would
// reach every process this user may signal.
func killRest() {
	_ = syscall.Kill(-1, syscall.SIGKILL)
	deadline := time.Now().Add(reapWait)
	for time.Now().Before(deadline) {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		switch {
		case errors.Is(err, syscall.EINTR), pid > 0:
		case err != nil:
			return // ECHILD: none left
		default:
			time.Sleep(5 * time.Millisecond)
		}
	}
}
