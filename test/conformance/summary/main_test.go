package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A report as ginkgo --json-report writes it: a list of suite reports whose SpecReports hold
// every spec of e2e.test, including those the focus left out and other drivers' specs.
const fixture = `[{"SuiteDescription":"Kubernetes e2e suite","SpecReports":[
 {"ContainerHierarchyTexts":["[sig-storage] CSI Volumes","External Storage [Driver: loop-block]","[Testpattern: Dynamic PV (default fs)] provisioning"],"LeafNodeType":"It","LeafNodeText":"should provision storage with defaults","State":"passed","RunTime":2000000000},
 {"ContainerHierarchyTexts":["[sig-storage] CSI Volumes","External Storage [Driver: loop-block]","[Testpattern: Dynamic PV (default fs)] multiVolume"],"LeafNodeType":"It","LeafNodeText":"should access to two volumes from different nodes","State":"skipped","Failure":{"Message":"Number of available nodes is less than 2 - skipping"}},
 {"ContainerHierarchyTexts":["[sig-storage] CSI Volumes","External Storage [Driver: loop-block]","[Testpattern: Dynamic PV (ntfs)] volumes"],"LeafNodeType":"It","LeafNodeText":"should store data","State":"skipped","Failure":{"Message":"Distro  doesn't support ntfs -- skipping"}},
 {"ContainerHierarchyTexts":["[sig-storage] CSI Volumes","External Storage [Driver: loop-block]","[Testpattern: Dynamic PV (default fs)] disruptive [Disruptive]"],"LeafNodeType":"It","LeafNodeText":"should work after restart","State":"skipped"},
 {"ContainerHierarchyTexts":["[sig-storage] CSI Volumes","External Storage [Driver: loop-block]","[Testpattern: Dynamic PV (default fs)] volumes"],"LeafNodeType":"It","LeafNodeText":"should allow exec of files on the volume","State":"failed","RunTime":5000000000,"Failure":{"Message":"Timed out after 300s.\nexpected pod to be running"}},
 {"ContainerHierarchyTexts":["[sig-storage] CSI Volumes","External Storage [Driver: loop-block]","[Testpattern: Windows]"],"LeafNodeType":"It","LeafNodeText":"should do windows things","State":"skipped","Failure":{"Message":"Only supported for node OS distro [windows] (not )"}},
 {"ContainerHierarchyTexts":["[sig-storage] CSI Volumes","External Storage [Driver: pav-e2e]","provisioning"],"LeafNodeType":"It","LeafNodeText":"other driver","State":"failed"},
 {"ContainerHierarchyTexts":["[sig-apps] Deployment"],"LeafNodeType":"It","LeafNodeText":"not storage","State":"skipped"},
 {"ContainerHierarchyTexts":[],"LeafNodeType":"SynchronizedBeforeSuite","LeafNodeText":"","State":"passed"}
]}]`

func TestSummarize(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "report.json")
	if err := os.WriteFile(path, []byte(fixture), 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := readReport(path)
	if err != nil {
		t.Fatal(err)
	}
	r := summarize("loop-block", rep, nil)
	if r.passed != 1 || r.failed != 1 || r.skipped != 3 || r.notSelected != 1 {
		t.Errorf("passed/failed/skipped/not selected = %d/%d/%d/%d, want 1/1/3/1", r.passed, r.failed, r.skipped, r.notSelected)
	}
	for why, want := range map[string]int{whySingleNode: 1, whyFiltered: 0, whyFeatureAbsent: 2} {
		n := 0
		for _, specs := range r.skips[why] {
			n += len(specs)
		}
		if n != want {
			t.Errorf("skipped %q: %d specs, want %d (%v)", why, n, want, r.skips)
		}
	}

	var out bytes.Buffer
	md := filepath.Join(dir, "summary.md")
	failed, err := run([]string{"-o", md, "-left-out", `\[Disruptive\]=disruptive: restarts the kubelet`, "loop-block=" + path}, &out)
	if err != nil || !failed {
		t.Fatalf("run: failed=%v err=%v, want a failure reported", failed, err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if last := lines[len(lines)-1]; last != "conformance: 1 passed, 1 failed, 4 skipped" {
		t.Errorf("last line %q", last)
	}
	if !strings.Contains(out.String(), "FAILED [sig-storage] CSI Volumes External Storage [Driver: loop-block]") {
		t.Errorf("the failed spec is not named:\n%s", out.String())
	}
	text, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| loop-block | 1 | 1 | 4 |", "- disruptive: restarts the kubelet — 1 spec(s)", "Timed out after 300s.", "### Skipped: needs more than one node or topology segment (1)", "Distro  doesn't support ntfs"} {
		if !strings.Contains(string(text), want) {
			t.Errorf("summary.md lacks %q:\n%s", want, text)
		}
	}
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct{ message, want string }{
		{"", whyFiltered},
		{"Number of available nodes is less than 2 - skipping", whySingleNode},
		{"Driver pav-e2e does not support snapshots -- skipping", whyCapability},
		{"Driver \"loop-block\" does not support volume expansion - skipping", whyCapability},
		{"Driver loop-block doesn't specify performance test options -- skipping", whyCapability},
		{"Driver loop-block only supports singleNodeVolume -- skipping", whyNodeLocal},
		{"No topology with at least 2 nodes found - skipping", whySingleNode},
		{"Test is not valid for Block volume mode - skipping", whyPattern},
		// skipped because the cluster has several segments, not for lack of them
		{"VolumeBindingMode immediate is not compatible with a multi-topology environment.", whyPattern},
		{"Not enough topologies in cluster -- skipping", whySingleNode},
		{"Filesystem volume case should be covered by block volume case -- skipping", whyPattern},
		// the pattern has no snapshot type; a driver without snapshots says "volume snapshots"
		{`Driver "loop-block" does not support snapshots - skipping`, whyPattern},
		{`Driver "pav-e2e" does not support volume snapshots - skipping`, whyCapability},
		{"WaitForFirstConsumer binding mode currently not supported for this test", whyPattern},
		{"Suite \"provisioning\" does not support InlineVolume", whyPattern},
		{"Only supported for node OS distro [windows] (not )", whyFeatureAbsent},
	} {
		if got := classify(tc.message); got != tc.want {
			t.Errorf("classify(%q) = %q, want %q", tc.message, got, tc.want)
		}
	}
}

func TestRunRefusesBadArguments(t *testing.T) {
	for _, args := range [][]string{nil, {"loop-block"}, {"=x.json"}, {"d=/does/not/exist.json"}} {
		if _, err := run(args, &bytes.Buffer{}); err == nil {
			t.Errorf("run(%q): no error", args)
		}
	}
}

func TestClassifyLeftOut(t *testing.T) {
	var rules []leftOut
	for _, v := range []string{`\[Disruptive\]=disruptive`, `Windows=feature absent: no Windows nodes`} {
		r, err := parseLeftOut(v)
		if err != nil {
			t.Fatal(err)
		}
		rules = append(rules, r)
	}
	for _, tc := range []struct{ name, why, reason string }{
		{"External Storage [Driver: x] disruptive [Disruptive] should work", whyFiltered, "disruptive"},
		{"External Storage [Driver: x] [Feature:Windows] should", whyFeatureAbsent, "no Windows nodes"},
		{"External Storage [Driver: x] something else", whyFiltered, ""},
	} {
		if why, reason := classifyLeftOut(tc.name, rules); why != tc.why || reason != tc.reason {
			t.Errorf("classifyLeftOut(%q) = %q, %q; want %q, %q", tc.name, why, reason, tc.why, tc.reason)
		}
	}
	for _, bad := range []string{"noequals", "=reason", "re=", "([=x"} {
		if _, err := parseLeftOut(bad); err == nil {
			t.Errorf("parseLeftOut(%q): no error", bad)
		}
	}
}
