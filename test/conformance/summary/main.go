// Command summary reads the Ginkgo JSON reports that make conformance writes (one per
// testdriver, _output/conformance/<driver>/report.json) and prints one line per driver and
// the last line `conformance: N passed, N failed, N skipped`; with -o it also writes a
// Markdown summary: every failed spec with its message, every skipped spec grouped by why.
//
// It reads the report's JSON by itself (a few fields of Ginkgo's types.Report), so that the
// main module does not depend on Ginkgo for one struct.
//
// Usage: summary [-o summary.md] [-left-out REGEXP=REASON]... DRIVER=REPORT.json...
// It exits 1 when a spec failed or a report cannot be read.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"
)

// specReport is the part of Ginkgo's types.SpecReport the summary uses. State and
// LeafNodeType are written by Ginkgo as strings ("passed", "It").
type specReport struct {
	ContainerHierarchyTexts []string
	LeafNodeType            string
	LeafNodeText            string
	State                   string
	RunTime                 time.Duration
	Failure                 struct{ Message string }
}

type report struct {
	SpecReports []specReport
}

// Why a spec was skipped, as the summary groups them (issue 23: single node, capability not
// advertised, feature absent; and specs that do not apply to a pattern, or to node-local
// volumes), plus the specs the run's -skip expression left out.
const (
	whySingleNode    = "needs more than one node or topology segment"
	whyNodeLocal     = "needs a volume reachable from several nodes (the driver's volumes are node-local: singleNodeVolume)"
	whyCapability    = "capability not advertised by the driver"
	whyPattern       = "does not apply to this test pattern or binding mode"
	whyFeatureAbsent = "feature or platform absent from the cluster"
	whyFiltered      = "left out by make conformance's skip expression"
)

// skipRules classify a skipped spec's message (the e2eskipper texts of
// k8s.io/kubernetes/test/e2e/storage); the first match wins. What matches none is taken for a
// feature or platform the cluster lacks: the suite says so in many words.
var skipRules = []struct {
	re  *regexp.Regexp
	why string
}{
	// Immediate binding of a generic ephemeral volume is skipped on a cluster of several
	// topology segments: a binding mode that does not apply there, not a missing node.
	{regexp.MustCompile(`(?i)immediate is not compatible with a multi-topology environment`), whyPattern},
	{regexp.MustCompile(`(?i)nodes is less than|with at least \d+ nodes|not enough topologies`), whySingleNode},
	{regexp.MustCompile(`only supports singleNodeVolume`), whyNodeLocal},
	{regexp.MustCompile(`(?i)^(Suite|Test|This test) .*(not (support|valid)|covered by)|not implemented|^skipping multiple PV mount test for block|binding mode currently not supported|raw block volumes cannot be read-only|is (not )?ephemeral|skipping %?\d|^Skipping .* test for expansion|supports dynamic provisioning, skipping|incompatible with this test|Multiple generic ephemeral volumes|^Filesystem volume case should be covered by block|^Driver .* does not support snapshots - skipping`), whyPattern},
	{regexp.MustCompile(`(?i)^Driver .*(does not|doesn't|didn't|has no|returned nil|requires)|does not have any InlineVolumeAttributes|does not support multiple PVs|only works with CSI drivers`), whyCapability},
}

type spec struct {
	name    string
	state   string
	message string
	runTime time.Duration
}

type driverResult struct {
	driver                  string
	passed, failed, skipped int
	notSelected             int // not in the run's focus (CONFORMANCE_FOCUS): not counted

	runTime  time.Duration
	failures []spec
	skips    map[string]map[string][]string // why → message → spec names
}

// inDriver tells a spec of this driver's External Storage tests: the run's report also lists
// every other spec of e2e.test, left out by the focus.
func inDriver(s specReport, driver string) bool {
	full := strings.Join(s.ContainerHierarchyTexts, " ")
	return s.LeafNodeType == "It" && strings.Contains(full, "External Storage") &&
		strings.Contains(full, "[Driver: "+driver+"]")
}

func specName(s specReport) string {
	return strings.TrimSpace(strings.Join(append(append([]string{}, s.ContainerHierarchyTexts...), s.LeafNodeText), " "))
}

// firstLine is the first non-empty line of a message, for grouping and one-line output.
func firstLine(m string) string {
	for _, l := range strings.Split(m, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			return l
		}
	}
	return ""
}

// leftOut is why the run's -skip expression left a spec out: its terms, each with the reason
// make conformance gives for it (-left-out REGEXP=REASON), so that the summary names the
// reason of every spec it did not run.
type leftOut struct {
	re     *regexp.Regexp
	reason string
}

// parseLeftOut reads -left-out's REGEXP=REASON (split at the first "="); the reason starts with the group it belongs
// to ("feature absent: …", else it is counted as left out by the skip expression).
func parseLeftOut(v string) (leftOut, error) {
	expr, reason, _ := strings.Cut(v, "=")
	if expr == "" || reason == "" {
		return leftOut{}, fmt.Errorf("-left-out %q: want REGEXP=REASON", v)
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		return leftOut{}, fmt.Errorf("-left-out %q: %w", v, err)
	}
	return leftOut{re: re, reason: reason}, nil
}

// classifyLeftOut is the group and reason of a spec Ginkgo skipped without a message: the
// run's -skip expression left it out.
func classifyLeftOut(name string, rules []leftOut) (why, reason string) {
	for _, r := range rules {
		if r.re.MatchString(name) {
			if rest, ok := strings.CutPrefix(r.reason, "feature absent: "); ok {
				return whyFeatureAbsent, rest
			}
			return whyFiltered, r.reason
		}
	}
	return whyFiltered, ""
}

func classify(message string) string {
	if strings.TrimSpace(message) == "" {
		return whyFiltered
	}
	for _, r := range skipRules {
		if r.re.MatchString(message) {
			return r.why
		}
	}
	return whyFeatureAbsent
}

func summarize(driver string, r report, rules []leftOut) driverResult {
	res := driverResult{driver: driver, skips: map[string]map[string][]string{}}
	for _, s := range r.SpecReports {
		if !inDriver(s, driver) {
			continue
		}
		res.runTime += s.RunTime
		switch s.State {
		case "passed":
			res.passed++
		case "skipped", "pending":
			why, msg := classify(s.Failure.Message), firstLine(s.Failure.Message)
			if why == whyFiltered {
				if why, msg = classifyLeftOut(specName(s), rules); msg == "" {
					// Skipped without a message and left out by no -skip term: the
					// run's focus did not select it.
					res.notSelected++
					continue
				}
			}
			res.skipped++
			if res.skips[why] == nil {
				res.skips[why] = map[string][]string{}
			}
			res.skips[why][msg] = append(res.skips[why][msg], specName(s))
		default: // failed, panicked, timedout, interrupted, aborted
			res.failed++
			res.failures = append(res.failures, spec{name: specName(s), state: s.State, message: s.Failure.Message, runTime: s.RunTime})
		}
	}
	return res
}

func readReport(path string) (report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return report{}, err
	}
	// ginkgo --json-report writes a list of reports (one per suite run).
	var reports []report
	if err := json.Unmarshal(data, &reports); err != nil {
		return report{}, fmt.Errorf("%s: not a Ginkgo JSON report: %w", path, err)
	}
	var all report
	for _, r := range reports {
		all.SpecReports = append(all.SpecReports, r.SpecReports...)
	}
	return all, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func writeMarkdown(w io.Writer, results []driverResult) {
	fmt.Fprintf(w, "# Kubernetes External Storage suite: summary\n\n")
	fmt.Fprintf(w, "| driver | passed | failed | skipped | spec time |\n|---|---|---|---|---|\n")
	for _, r := range results {
		fmt.Fprintf(w, "| %s | %d | %d | %d | %s |\n", r.driver, r.passed, r.failed, r.skipped, r.runTime.Round(time.Second))
	}
	for _, r := range results {
		fmt.Fprintf(w, "\n## %s\n", r.driver)
		if len(r.failures) > 0 {
			fmt.Fprintf(w, "\n### Failed\n")
			for _, f := range r.failures {
				fmt.Fprintf(w, "\n- **%s** (%s, %s)\n\n  ```\n  %s\n  ```\n", f.name, f.state, f.runTime.Round(time.Second),
					strings.ReplaceAll(strings.TrimSpace(f.message), "\n", "\n  "))
			}
		}
		for _, why := range sortedKeys(r.skips) {
			n := 0
			for _, specs := range r.skips[why] {
				n += len(specs)
			}
			fmt.Fprintf(w, "\n### Skipped: %s (%d)\n", why, n)
			for _, msg := range sortedKeys(r.skips[why]) {
				specs := r.skips[why][msg]
				if msg == "" {
					msg = "(no message)"
				}
				fmt.Fprintf(w, "\n- %s — %d spec(s)\n", msg, len(specs))
				for _, s := range specs {
					fmt.Fprintf(w, "  - %s\n", s)
				}
			}
		}
	}
}

func run(args []string, stdout io.Writer) (failed bool, err error) {
	fs := flag.NewFlagSet("summary", flag.ContinueOnError)
	out := fs.String("o", "", "also write a Markdown summary to this file")
	var rules []leftOut
	fs.Func("left-out", "REGEXP=REASON: why the run's -skip expression left out the specs REGEXP matches (repeatable; a REASON starting \"feature absent: \" counts in that group)", func(v string) error {
		r, err := parseLeftOut(v)
		rules = append(rules, r)
		return err
	})
	if err := fs.Parse(args); err != nil {
		return false, err
	}
	if fs.NArg() == 0 {
		return false, fmt.Errorf("usage: summary [-o summary.md] [-left-out REGEXP=REASON]... DRIVER=REPORT.json...")
	}
	var results []driverResult
	var total driverResult
	for _, a := range fs.Args() {
		driver, path, ok := strings.Cut(a, "=")
		if !ok || driver == "" || path == "" {
			return false, fmt.Errorf("%q: want DRIVER=REPORT.json", a)
		}
		rep, err := readReport(path)
		if err != nil {
			return false, err
		}
		r := summarize(driver, rep, rules)
		if r.passed+r.failed+r.skipped+r.notSelected == 0 {
			return false, fmt.Errorf("%s: no spec of driver %s: the suite did not run its External Storage tests", path, driver)
		}
		results = append(results, r)
		total.passed += r.passed
		total.failed += r.failed
		total.skipped += r.skipped
		var whys []string
		for _, why := range sortedKeys(r.skips) {
			n := 0
			for _, specs := range r.skips[why] {
				n += len(specs)
			}
			whys = append(whys, fmt.Sprintf("%d %s", n, why))
		}
		if r.notSelected > 0 {
			whys = append(whys, fmt.Sprintf("and %d not in this run's focus, not counted", r.notSelected))
		}
		fmt.Fprintf(stdout, "conformance: driver %s: %d passed, %d failed, %d skipped (%s)\n", driver, r.passed, r.failed, r.skipped, strings.Join(whys, "; "))
		for _, f := range r.failures {
			fmt.Fprintf(stdout, "  FAILED %s: %s\n", f.name, firstLine(f.message))
		}
	}
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			return false, err
		}
		writeMarkdown(f, results)
		if err := f.Close(); err != nil {
			return false, err
		}
	}
	fmt.Fprintf(stdout, "conformance: %d passed, %d failed, %d skipped\n", total.passed, total.failed, total.skipped)
	return total.failed > 0, nil
}

func main() {
	failed, err := run(os.Args[1:], os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "summary:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}
