package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// kubectl finds a kubectl with kustomize: $KUBECTL, the one `make tools` builds,
// or PATH. Without one the kustomize tests skip, saying why: kustomize is not a
// Go dependency of pav (sigs.k8s.io/kustomize/api is not in go.sum), and
// `make test` on a machine set up by `make tools` always has it.
func kubectl(t *testing.T) string {
	t.Helper()
	for _, c := range []string{os.Getenv("KUBECTL"), "../_output/bin/kubectl"} {
		if c != "" {
			if _, err := os.Stat(c); err == nil {
				return c
			}
		}
	}
	if p, err := exec.LookPath("kubectl"); err == nil {
		return p
	}
	t.Skip("no kubectl (make tools builds _output/bin/kubectl; or set KUBECTL): kustomize output not checked")
	return ""
}

func kustomize(t *testing.T, dir string) []byte {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(kubectl(t), "kustomize", dir)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, errb.String())
	}
	return out.Bytes()
}

// deploy/pav.yaml is `kustomize build deploy` (plus a comment header): what
// `kubectl apply -f pav.yaml` installs is what `kubectl apply -k deploy` does.
func TestRenderedInstallIsCurrent(t *testing.T) {
	want := kustomize(t, ".")
	got, err := os.ReadFile("pav.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var body []string
	for _, l := range strings.SplitAfter(string(got), "\n") {
		if len(body) == 0 && strings.HasPrefix(l, "#") {
			continue // the header
		}
		body = append(body, l)
	}
	if strings.Join(body, "") != string(want) {
		t.Fatal("deploy/pav.yaml is not what deploy/ renders to: run `make manifests`")
	}
}

// The install holds what the README promises, and the e2e install overlay
// changes nothing but the manager's settings and image.
func TestInstallContents(t *testing.T) {
	full := string(kustomize(t, "."))
	for _, want := range []string{
		"kind: Namespace", "name: pavprovisioners.pav.albertofaria.github.io", "kind: ValidatingAdmissionPolicy",
		"name: pav-controller", "name: pav-node", "name: pav-driver", "kind: Deployment", "name: pav-manager",
		"kind: ConfigMap",
	} {
		if !strings.Contains(full, want) {
			t.Errorf("kustomize build deploy lacks %q", want)
		}
	}
	if regexp.MustCompile(`(?m)^kind: (StatefulSet|DaemonSet|CSIDriver|PavProvisioner)$`).MatchString(full) {
		t.Error("the install deploys a provisioner: provisioners are the user's to apply")
	}
	local := string(kustomize(t, "../test/e2e/install"))
	lines := func(s string) map[string]int {
		m := map[string]int{}
		for _, l := range strings.Split(s, "\n") {
			m[l]++
		}
		return m
	}
	a, b := lines(full), lines(local)
	var changed []string
	for l, n := range b {
		if a[l] != n {
			changed = append(changed, l)
		}
	}
	for _, l := range changed {
		ok := strings.TrimSpace(l) == "" ||
			strings.Contains(l, "pav-manager-") || // the ConfigMap's hash suffix
			strings.Contains(l, "image: pav.local/pav:dev") || strings.Contains(l, "imagePullPolicy: Never") ||
			strings.HasPrefix(l, "    ") // inside config.yaml (ConfigMap data)
		if !ok {
			t.Errorf("the e2e install overlay changes %q: it may change only the manager's settings and image", l)
		}
	}
}

// VERSION in the Makefile is the tag every manifest gives the pav image, the
// Dockerfile's default VERSION and the prefix of the binary's default version.
func TestVersionsAgree(t *testing.T) {
	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^VERSION\s*\?=\s*(v\S+)\s*$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("Makefile: no `VERSION ?= v...` line")
	}
	version := string(m[1])
	image := regexp.MustCompile(`ghcr\.io/pods-as-volumes/pav:(\S+)`)
	found := 0
	err = filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, tag := range image.FindAllSubmatch(b, -1) {
			found++
			if string(tag[1]) != version {
				t.Errorf("deploy/%s names pav:%s, the Makefile's VERSION is %s", path, tag[1], version)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found < 5 { // controller, node, manager, config.yaml, and pav.yaml's copies
		t.Errorf("only %d pav image references found in deploy/", found)
	}
	df, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(df, []byte("ARG VERSION="+version+"\n")) {
		t.Errorf("Dockerfile: want `ARG VERSION=%s`", version)
	}
	mainGo, err := os.ReadFile("../cmd/pav/main.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(mainGo, []byte(`var version = "`+version+`-dev"`)) {
		t.Errorf("cmd/pav/main.go: want the default version %q", version+"-dev")
	}
}
