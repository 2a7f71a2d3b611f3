package report_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pods-as-volumes/pav/internal/report"
)

// A file printed to the log comes back exactly, found by its report's
// reference among whatever else the container printed, markers that look
// like ours included.
func TestLogFileRoundTrip(t *testing.T) {
	long := strings.Repeat("y", 200<<10) // longer than the reader's buffer
	for _, tc := range []struct {
		name, content, before, after string
	}{
		{"lines", "0 4096\n8192 4096\n", "the command's output\n", ""},
		{"no final newline", "0 4096", "", ""},
		{"empty", "", "", ""},
		{"output without a final newline before it", "0 1\n", "partial line", "more after\n"},
		{"a fake marker with another nonce", "0 1\n", "\npav-report: begin /pav/blocks 00000000000000000000000000000000\n1 1\n", ""},
		{"long lines around it", long + "\n", long, long},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, map[string]string{"blocks": tc.content})
			var log bytes.Buffer
			log.WriteString(tc.before)
			refs, problems := report.PrintLogFiles(dir, []string{report.FileBlocks}, &log)
			log.WriteString(tc.after)
			if len(problems) > 0 {
				t.Fatal(problems)
			}
			ref := refs[report.LogRefKey(report.FileBlocks)]
			got, err := report.ReadLogFile(bytes.NewReader(log.Bytes()), report.FileBlocks, ref)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.content {
				t.Errorf("got %d bytes, want %d", len(got), len(tc.content))
			}
		})
	}
}

func TestLogFileProblems(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"blocks": "0 4096\n"})
	var log bytes.Buffer
	refs, _ := report.PrintLogFiles(dir, []string{report.FileBlocks}, &log)
	ref := refs[report.LogRefKey(report.FileBlocks)]
	nonce, _, digest := func() (string, string, string) { f := strings.Fields(ref); return f[0], f[1], f[2] }()
	for _, tc := range []struct {
		name, log, ref, want string
	}{
		{"rotated away", "other output\n", ref, "is not in the container's log"},
		{"cut short", log.String()[:len(log.String())-30], ref, "does not end where its report says"},
		{"tampered", strings.Replace(log.String(), "4096", "4097", 1), ref, "does not match its digest"},
		{"another size", log.String(), nonce + " 3 " + digest, "does not end where its report says"},
		{"malformed reference", log.String(), "x", "malformed"},
		{"bad size", log.String(), nonce + " -1 " + digest, "bad size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := report.ReadLogFile(strings.NewReader(tc.log), report.FileBlocks, tc.ref)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
	// Too large, absent, not a regular file: never printed.
	big := t.TempDir()
	if err := os.WriteFile(filepath.Join(big, "blocks"), bytes.Repeat([]byte("0 1\n"), report.MaxLogFile/4+1), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	refs, problems := report.PrintLogFiles(big, []string{report.FileBlocks}, &out)
	if len(refs) != 0 || out.Len() != 0 || len(problems) != 1 || !strings.Contains(problems[0], "is larger than the 4194304 bytes pav carries") {
		t.Errorf("too large: refs %v, %d bytes printed, problems %v", refs, out.Len(), problems)
	}
	refs, problems = report.PrintLogFiles(t.TempDir(), []string{report.FileBlocks}, &out)
	if len(refs) != 0 || len(problems) != 0 || out.Len() != 0 {
		t.Errorf("absent: refs %v, problems %v", refs, problems)
	}
	link := t.TempDir()
	if err := os.Symlink("/etc/passwd", filepath.Join(link, "blocks")); err != nil {
		t.Fatal(err)
	}
	if refs, problems = report.PrintLogFiles(link, []string{report.FileBlocks}, &out); len(refs) != 0 || len(problems) != 1 {
		t.Errorf("symlink: refs %v, problems %v", refs, problems)
	}
}

// The report carries the reference (never dropped before the other files),
// and Parse hands it over; a problem printing is a report problem.
func TestReportCarriesLogReferences(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"blocks": "0 1\n", "error": strings.Repeat("e", 8000)})
	refs, problems := report.PrintLogFiles(dir, []string{report.FileBlocks}, &bytes.Buffer{})
	msg := report.MessageWith(dir, 1024, refs, problems)
	if len(msg) > 1024 {
		t.Fatalf("message of %d bytes", len(msg))
	}
	files, err := report.Parse(msg)
	if err != nil {
		t.Fatal(err)
	}
	if files[report.LogRefKey(report.FileBlocks)] != refs[report.LogRefKey(report.FileBlocks)] || files["blocks"] != "" {
		t.Errorf("files %v, want the reference %v", files, refs)
	}
	_, err = report.Parse(report.MessageWith(dir, 4096, nil, []string{"/pav/blocks (5000000 bytes) is larger than the 4194304 bytes pav carries"}))
	if err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("problem not reported: %v", err)
	}
}

// pav-report --exec --log-file=blocks: the command's output, then the copy
// of /pav/blocks, on stdout; the report refers to it.
func TestExecPrintsLogFiles(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("D", dir)
	termLog := filepath.Join(t.TempDir(), "termination-log")
	out := filepath.Join(t.TempDir(), "stdout")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = f
	code := report.Command(t.Context(), []string{"--exec", "--dir=" + dir, "--termination-log=" + termLog, "--log-file=blocks", "--",
		"sh", "-c", `echo listing; printf '0 512\n1024 512\n' > "$D/blocks"`})
	os.Stdout = stdout
	f.Close()
	if code != 0 {
		t.Fatalf("exit code %d", code)
	}
	msg, err := os.ReadFile(termLog)
	if err != nil {
		t.Fatal(err)
	}
	files, err := report.Parse(string(msg))
	if err != nil {
		t.Fatal(err)
	}
	log, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	got, err := report.ReadLogFile(log, report.FileBlocks, files[report.LogRefKey(report.FileBlocks)])
	if err != nil || got != "0 512\n1024 512\n" {
		t.Errorf("blocks %q, %v", got, err)
	}
	if code := report.Command(t.Context(), []string{"--exec", "--log-file=handle", "--", "true"}); code != 2 {
		t.Errorf("--log-file=handle accepted (exit code %d)", code)
	}
}
