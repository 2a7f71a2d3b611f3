package report

// Files carried through the container's log. A termination message holds 4
// KiB at most; some files are larger: a snapshotMetadata pod's /pav/blocks
// lists every allocated or changed range of a snapshot (a few hundred
// thousand lines for a fragmented volume). pav-report, once the command has
// ended (and, as PID 1, what it left running is killed), prints each such file
// to its own stdout, which is the container's log, between two marker lines
// carrying a nonce it draws then; the termination message carries, for each,
// the nonce, the size and the SHA-256 of what was printed. The driver reads
// the container's log through the API (pods/log) and takes exactly those
// bytes, checked against size and digest. The nonce is drawn after the
// command ended, so nothing the command printed can pass for a marker.
//
// The kubelet keeps a container's log in files of containerLogMaxSize (10 MiB
// by default) and serves only the current one: a file is carried only up to
// MaxLogFile, well below that, so that the command's own output and the copy
// fit in one log file.

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

const (
	// FileBlocks is where a snapshotMetadata pod lists the allocated or
	// changed ranges of a snapshot: carried through the log.
	FileBlocks = "blocks"
	// MaxLogFile bounds a file carried through the log (4 MiB: some 150,000
	// lines of "OFFSET LENGTH").
	MaxLogFile = 4 << 20
	// logRefPrefix starts the report key of a file carried through the log
	// ("log:blocks"); its value is "NONCE SIZE SHA256".
	logRefPrefix = "log:"
	// The marker lines around a file's copy in the log.
	markerBegin = "pav-report: begin /pav/%s %s"
	markerEnd   = "pav-report: end /pav/%s %s"
)

// LogFiles are the files that may be carried through the log (--log-file).
var LogFiles = []string{FileBlocks}

// ErrLogFileInvalid is what ReadLogFile's errors about the log's content are
// (errors.Is): the copy is not there, or not what the report says. Reading
// the log again cannot help; other errors are the reader's.
var ErrLogFileInvalid = errors.New("no valid copy in the log")

// LogRefKey is the report key of the reference to file name's copy in the log.
func LogRefKey(name string) string { return logRefPrefix + name }

// isLogFile: name may be carried through the log.
func isLogFile(name string) bool {
	for _, n := range LogFiles {
		if n == name {
			return true
		}
	}
	return false
}

// PrintLogFiles prints each of names that dir holds to w between its marker
// lines (a fresh nonce each), and returns the references the report carries
// (by LogRefKey) and what could not be printed (a file too large, not a
// regular file, unreadable). A file that is absent is left out.
func PrintLogFiles(dir string, names []string, w io.Writer) (refs map[string]string, problems []string) {
	refs = map[string]string{}
	for _, name := range names {
		if !isLogFile(name) {
			problems = append(problems, fmt.Sprintf("/pav/%s cannot be carried through the log (only %s)", name, strings.Join(LogFiles, ", ")))
			continue
		}
		s, err := readReportFile(filepath.Join(dir, name), MaxLogFile, false)
		var tl errTooLarge
		switch {
		case errors.Is(err, os.ErrNotExist):
			continue
		case errors.As(err, &tl):
			problems = append(problems, fmt.Sprintf("/pav/%s (%d bytes) is larger than the %d bytes pav carries: list fewer, larger ranges", name, tl.size, MaxLogFile))
			continue
		case err != nil:
			problems = append(problems, err.Error())
			continue
		}
		nonce, err := newNonce()
		if err != nil {
			problems = append(problems, fmt.Sprintf("/pav/%s: %v", name, err))
			continue
		}
		sum := sha256.Sum256([]byte(s))
		// One write: the log is the container's stdout, shared with nothing
		// once the command has ended.
		var b bytes.Buffer
		fmt.Fprintf(&b, "\n"+markerBegin+"\n", name, nonce)
		b.WriteString(s)
		fmt.Fprintf(&b, "\n"+markerEnd+"\n", name, nonce)
		if _, err := w.Write(b.Bytes()); err != nil {
			problems = append(problems, fmt.Sprintf("/pav/%s: writing it to the log: %v", name, err))
			continue
		}
		refs[LogRefKey(name)] = fmt.Sprintf("%s %d %s", nonce, len(s), hex.EncodeToString(sum[:]))
	}
	return refs, problems
}

func newNonce() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("no randomness for the log marker: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// ReadLogFile finds the copy of file name in a container's log by the
// reference its report carries (ref: "NONCE SIZE SHA256") and returns it,
// checked against the size and digest. An error says what is wrong: the copy
// is not in the log (the kubelet rotated the log file, or the log is another
// container's), or it is not what pav-report printed.
func ReadLogFile(log io.Reader, name, ref string) (string, error) {
	f := strings.Fields(ref)
	if len(f) != 3 {
		return "", fmt.Errorf("%w: the report's reference to /pav/%s in the log is malformed: %q", ErrLogFileInvalid, name, ref)
	}
	nonce, digest := f[0], f[2]
	size, err := strconv.Atoi(f[1])
	if err != nil || size < 0 || size > MaxLogFile {
		return "", fmt.Errorf("%w: the report's reference to /pav/%s in the log has a bad size %q", ErrLogFileInvalid, name, f[1])
	}
	begin := []byte(fmt.Sprintf(markerBegin, name, nonce) + "\n")
	r := bufio.NewReaderSize(log, 64<<10)
	// Lines are matched whole; a line longer than the buffer is skipped.
	atLineStart := true
	for {
		line, err := r.ReadSlice('\n')
		if atLineStart && bytes.Equal(line, begin) {
			break
		}
		atLineStart = err == nil
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if errors.Is(err, io.EOF) {
			return "", fmt.Errorf("%w: the copy of /pav/%s is not in the container's log (the kubelet may have rotated the log: keep the command's own output small)", ErrLogFileInvalid, name)
		}
		if err != nil {
			return "", fmt.Errorf("reading the container's log: %w", err)
		}
	}
	content := make([]byte, size)
	end := []byte("\n" + fmt.Sprintf(markerEnd, name, nonce) + "\n")
	tail := make([]byte, len(end))
	for _, b := range [][]byte{content, tail} {
		if _, err := io.ReadFull(r, b); errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return "", fmt.Errorf("%w: the copy of /pav/%s in the container's log does not end where its report says (%d bytes)", ErrLogFileInvalid, name, size)
		} else if err != nil {
			return "", fmt.Errorf("reading the container's log: %w", err)
		}
	}
	if !bytes.Equal(tail, end) {
		return "", fmt.Errorf("%w: the copy of /pav/%s in the container's log does not end where its report says (%d bytes)", ErrLogFileInvalid, name, size)
	}
	sum := sha256.Sum256(content)
	if hex.EncodeToString(sum[:]) != digest {
		return "", fmt.Errorf("%w: the copy of /pav/%s in the container's log does not match its digest", ErrLogFileInvalid, name)
	}
	return string(content), nil
}
