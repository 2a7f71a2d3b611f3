// Package report is the protocol by which a pav pod hands what it left in
// /pav (handle, capacity, maximumVolumeSize, topology, error) to the driver: Message encodes the
// files as one JSON object within the kubelet's termination-message limits,
// Parse decodes it, Run is the report sidecar that writes it when the pod's
// other containers are done, and Exec writes it when the command it runs for
// the pod's one container ends. It imports nothing but the standard library, so
// that the sidecar's binary (cmd/pav-report) starts in a millisecond and a
// megabyte: every controller-side pod runs one.
package report

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unicode/utf8"
)

const (
	// Dir is where pav mounts its volume in every container of its pods.
	Dir = "/pav"
	// TerminationLog is the kubelet's default termination-message path,
	// which Run writes.
	TerminationLog = "/dev/termination-log"
	// MaxMessage is what the kubelet keeps of a termination-log file (its
	// last 4096 bytes).
	MaxMessage = 4096
	// MaxBytesEnv tells the sidecar how large its message may be, when the
	// pod's containers share the kubelet's 12 KiB for all their messages. It
	// is an environment variable rather than a flag so that however the
	// sidecar parses its flags, the budget reaches Run.
	MaxBytesEnv = "PAV_REPORT_MAX_BYTES"
)

// The files a pod may leave in /pav that are reported to the driver.
const (
	FileHandle   = "handle"
	FileCapacity = "capacity"
	FileError    = "error"
	// FileTopology is where the creation pod says which topology segments
	// the volume is reachable from (YAML or JSON).
	FileTopology = "topology"
	// FileMaximumVolumeSize is where the capacity pod says the largest
	// volume it can make now (GetCapacity's maximum_volume_size), beside
	// the free bytes in FileCapacity.
	FileMaximumVolumeSize = "maximumVolumeSize"
	// FileSnapshots is where a groupSnapshotCreation pod says each member's
	// handle and size (YAML or JSON).
	FileSnapshots = "snapshots"
	// FileReady is not reported: for KeepRunning pods it is probed (see Run).
	FileReady = "ready"
	// FileExit is where pav-report --exec --exit-file, wrapping the command
	// of a node pod, writes the command's exit code when it ends (ExecNode):
	// the node plugin sees it through inotify, at once, where the pod's
	// status would come a kubelet relist later.
	FileExit = ".pav-exit"
	// FileEnded is where pav-report --exec --ended-file, wrapping the command
	// of a controller-side pod, puts a copy of its report once the command
	// has exited 0 and the report is in the termination log (ExecEnded): the
	// node plugin of the pod's node sees it through inotify and relays it to
	// the driver at once (internal/endrelay), where the pod's status would
	// carry it a kubelet relist later.
	FileEnded = ".pav-ended"
)

// Files are the files carried in the report. When the report is too large,
// error is truncated first (its tail is kept), then whole files are dropped,
// never cut (a cut handle, size, topology or member list would be silently
// wrong), in the order of encodeReport.
var Files = []string{FileHandle, FileCapacity, FileMaximumVolumeSize, FileTopology, FileSnapshots, FileError}

// reportProblemKey is an extra report entry saying what could not be reported;
// Parse turns it into an error.
const reportProblemKey = "reportProblem"

// ErrNoReport is returned by Parse for an empty termination message: the
// report sidecar never wrote one (it was killed, or never ran).
var ErrNoReport = errors.New("no pav report (the report sidecar wrote no termination message)")

// truncatedMark starts a truncated error text.
const truncatedMark = "…"

// Run is the body of pav-report (and `pav report`), the report sidecar of
// pav's controller-side pods.
//
// With checkReady (the readiness probe of KeepRunning pods) it returns 0 iff
// dir/ready exists, 1 otherwise.
//
// Otherwise it blocks until SIGTERM (sent by the kubelet once every other
// container of the pod has exited, or when the pod is deleted) or until ctx is
// done, then writes the files of dir that are present among Files
// as one JSON object to terminationLog (default /dev/termination-log) and
// returns 0. The message stays within the kubelet's limit (4096 bytes, or less
// when the pod has more than three containers: the budget comes from the
// PAV_REPORT_MAX_BYTES variable BuildPod sets); the tail of error is kept.
func Run(ctx context.Context, dir, terminationLog string, checkReady bool) int {
	return RunWith(ctx, dir, terminationLog, checkReady, nil)
}

// RunWith is Run that first prints the files logFiles names to the
// sidecar's log (PrintLogFiles) and reports where they are.
func RunWith(ctx context.Context, dir, terminationLog string, checkReady bool, logFiles []string) int {
	if dir == "" {
		dir = Dir
	}
	if checkReady {
		if _, err := os.Stat(filepath.Join(dir, FileReady)); err == nil {
			return 0
		}
		return 1
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	<-ctx.Done()
	if !write(dir, terminationLog, budgetFromEnv(), logFiles) {
		return 1
	}
	return 0
}

// write writes the report of dir (Message) to terminationLog (default
// TerminationLog) for Run and Exec, after printing the files logFiles names
// to stdout (PrintLogFiles); a failure is said on stderr.
func write(dir, terminationLog string, maxBytes int, logFiles []string) bool {
	_, ok := writeMessage(dir, terminationLog, maxBytes, logFiles)
	return ok
}

// writeMessage is write that also returns the message it wrote.
func writeMessage(dir, terminationLog string, maxBytes int, logFiles []string) (string, bool) {
	if terminationLog == "" {
		terminationLog = TerminationLog
	}
	var refs map[string]string
	var problems []string
	if len(logFiles) > 0 {
		refs, problems = PrintLogFiles(dir, logFiles, os.Stdout)
	}
	msg := MessageWith(dir, maxBytes, refs, problems)
	if err := os.WriteFile(terminationLog, []byte(msg), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "pav-report: writing %s: %v\n", terminationLog, err)
		return msg, false
	}
	return msg, true
}

// Command parses the arguments of pav-report and `pav report` (--dir,
// --check-ready, --termination-log; --exec, --max-bytes, --exit-file and the
// command after --) and runs Run or Exec; it returns the exit code.
func Command(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("pav report", flag.ContinueOnError)
	dir := fs.String("dir", Dir, "directory whose files are reported")
	checkReady := fs.Bool("check-ready", false, "exit 0 iff <dir>/ready exists (readiness probe)")
	termLog := fs.String("termination-log", TerminationLog, "file the report is written to")
	execute := fs.Bool("exec", false, "run the command after -- as a child, then write the report (see Exec)")
	maxBytes := fs.Int("max-bytes", MaxMessage, "with --exec: the report's budget (the sidecar reads "+MaxBytesEnv+")")
	exitFile := fs.String("exit-file", "", "with --exec: write the command's exit code to this file instead of the report (a node pod, whose /pav the node plugin reads)")
	endedFile := fs.String("ended-file", "", "with --exec: once the command has exited 0 and the report is written, put a copy of the report in this file (the node plugin relays it)")
	var logFiles []string
	fs.Func("log-file", "a file of the directory to print to the log and report by reference (repeatable; "+strings.Join(LogFiles, ", ")+")", func(v string) error {
		if !isLogFile(v) {
			return fmt.Errorf("only %s may be carried through the log", strings.Join(LogFiles, ", "))
		}
		logFiles = append(logFiles, v)
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *execute && *exitFile != "" {
		return ExecNode(fs.Args(), *exitFile)
	}
	if *execute {
		return ExecEnded(fs.Args(), *dir, *termLog, clampBudget(*maxBytes), logFiles, *endedFile)
	}
	return RunWith(ctx, *dir, *termLog, *checkReady, logFiles)
}

func budgetFromEnv() int {
	n, err := strconv.Atoi(os.Getenv(MaxBytesEnv))
	if err != nil {
		return MaxMessage
	}
	return clampBudget(n)
}

// clampBudget is n if it is a budget the kubelet can keep, else MaxMessage.
func clampBudget(n int) int {
	if n <= 0 || n > MaxMessage {
		return MaxMessage
	}
	return n
}

// Message reads the reported files of dir (readFiles) and encodes them as a
// JSON object of at most maxBytes bytes (what Run writes). Problems reading a
// file are reported inside the message, so that the driver sees them.
func Message(dir string, maxBytes int) string {
	return MessageWith(dir, maxBytes, nil, nil)
}

// MessageWith is Message with the references to the files printed to the log
// (PrintLogFiles' refs, by LogRefKey) and what could not be printed.
func MessageWith(dir string, maxBytes int, refs map[string]string, logProblems []string) string {
	files, problems := readFiles(dir, maxBytes)
	for k, v := range refs {
		files[k] = v
	}
	return encodeReport(files, append(logProblems, problems...), maxBytes)
}

// Read reads the reported files of dir as Message does, without encoding
// them: the node plugin reads its pods' /pav on the host with it. A file that
// could not be read is an error naming it, beside the files that could, as
// Parse makes of a report that says so.
func Read(dir string, maxBytes int) (map[string]string, error) {
	files, problems := readFiles(dir, maxBytes)
	if len(problems) > 0 {
		return files, problemsError(strings.Join(problems, "; "))
	}
	return files, nil
}

// problemsError is what could not be reported, as an error.
func problemsError(problems string) error { return fmt.Errorf("pav report: %s", problems) }

// readFiles reads the reported files of dir that are present, each within max
// bytes (error keeps its tail; a larger handle, capacity or topology is
// refused), and says what could not be read.
func readFiles(dir string, max int) (map[string]string, []string) {
	files := map[string]string{}
	var problems []string
	for _, name := range Files {
		// Keeping the tail of error is what matters; handle and capacity are
		// small and read whole (up to the budget, to detect oversize).
		s, err := readReportFile(filepath.Join(dir, name), max, name == FileError)
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			problems = append(problems, err.Error())
		default:
			files[name] = s
		}
	}
	return files, problems
}

// errTooLarge marks a file larger than the report budget (handle, capacity).
type errTooLarge struct {
	name string
	size int64
}

func (e errTooLarge) Error() string {
	return fmt.Sprintf("/pav/%s (%d bytes) is too large to report", e.name, e.size)
}

func readReportFile(path string, max int, tail bool) (string, error) {
	// A symlink could point anywhere in the reader's file system: the
	// sidecar's, or the node's for the node plugin, which reads its pods'
	// /pav itself (hostdir.go). O_NOFOLLOW refuses one at open, so that
	// nothing can swap it in between a check and the open; O_NONBLOCK keeps a
	// FIFO from blocking the open before the regular-file check below.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", err
	case errors.Is(err, syscall.ELOOP):
		return "", fmt.Errorf("/pav/%s is not a regular file (a symbolic link)", filepath.Base(path))
	case err != nil:
		return "", fmt.Errorf("/pav/%s: %v", filepath.Base(path), err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("/pav/%s: %v", filepath.Base(path), err)
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("/pav/%s is not a regular file", filepath.Base(path))
	}
	size := fi.Size()
	prefix := ""
	if size > int64(max) {
		if !tail {
			return "", errTooLarge{filepath.Base(path), size}
		}
		if _, err := f.Seek(size-int64(max), io.SeekStart); err != nil {
			return "", fmt.Errorf("/pav/%s: %v", filepath.Base(path), err)
		}
		prefix = truncatedMark
	}
	b, err := io.ReadAll(io.LimitReader(f, int64(max)))
	if err != nil {
		return "", fmt.Errorf("/pav/%s: %v", filepath.Base(path), err)
	}
	if prefix != "" {
		// The seek may have landed inside a multi-byte character.
		for len(b) > 0 && !utf8.RuneStart(b[0]) {
			b = b[1:]
		}
	}
	return prefix + string(b), nil
}

// encodeReport marshals files (plus problems) in at most max bytes: first by
// keeping only the tail of error, then by dropping whole files (error,
// snapshots, topology, maximumVolumeSize, capacity, handle, then the
// references to files carried in the log), saying so in reportProblemKey.
func encodeReport(files map[string]string, problems []string, max int) string {
	m := map[string]string{}
	for k, v := range files {
		m[k] = v
	}
	setProblems := func() {
		if len(problems) > 0 {
			m[reportProblemKey] = strings.Join(problems, "; ")
		}
	}
	setProblems()
	if b := marshalReport(m); len(b) <= max {
		return b
	}
	if e, ok := m[FileError]; ok {
		e = strings.TrimPrefix(e, truncatedMark)
		// Binary search for the longest tail of e that fits.
		lo, hi := 0, len(e)
		for lo < hi {
			mid := (lo + hi + 1) / 2
			m[FileError] = truncatedMark + tailRunes(e, mid)
			if len(marshalReport(m)) <= max {
				lo = mid
			} else {
				hi = mid - 1
			}
		}
		m[FileError] = truncatedMark + tailRunes(e, lo)
		if b := marshalReport(m); len(b) <= max {
			return b
		}
	}
	drop := []string{FileError, FileSnapshots, FileTopology, FileMaximumVolumeSize, FileCapacity, FileHandle}
	for _, name := range LogFiles {
		drop = append(drop, LogRefKey(name))
	}
	for _, name := range drop {
		v, ok := m[name]
		if !ok {
			continue
		}
		delete(m, name)
		problems = append(problems, errTooLarge{name, int64(len(v))}.Error())
		setProblems()
		if b := marshalReport(m); len(b) <= max {
			return b
		}
	}
	// Nothing fits (a tiny budget): say so as briefly as possible.
	m = map[string]string{reportProblemKey: "report too large"}
	if b := marshalReport(m); len(b) <= max {
		return b
	}
	return "{}"
}

// Tail is s if it fits in n bytes, else its last n bytes (whole characters)
// behind the mark of a cut text: how pav shortens an error or a log.
func Tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return truncatedMark + tailRunes(s, n)
}

// tailRunes is the last n bytes of s, moved forward to a character boundary.
func tailRunes(s string, n int) string {
	i := len(s) - n
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return s[i:]
}

func marshalReport(m map[string]string) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	// No HTML escaping: "<" as \u003c would only waste the budget.
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return "{}" // cannot happen for a map of strings
	}
	return strings.TrimSuffix(buf.String(), "\n")
}

// Parse decodes a report termination message into the reported files
// (those of Files that are present). An empty message yields
// ErrNoReport; a report that says some file could not be reported yields the
// files it has and an error naming the problem.
func Parse(msg string) (map[string]string, error) {
	files := map[string]string{}
	if strings.TrimSpace(msg) == "" {
		return files, ErrNoReport
	}
	var m map[string]string
	if err := json.Unmarshal([]byte(msg), &m); err != nil {
		return files, fmt.Errorf("invalid pav report %q: %w", abbreviate(msg, 200), err)
	}
	for _, name := range Files {
		if v, ok := m[name]; ok {
			files[name] = v
		}
	}
	for _, name := range LogFiles {
		if v, ok := m[LogRefKey(name)]; ok {
			files[LogRefKey(name)] = v
		}
	}
	if p, ok := m[reportProblemKey]; ok {
		return files, problemsError(p)
	}
	return files, nil
}

func abbreviate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + truncatedMark
}
