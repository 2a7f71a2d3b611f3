// Package linkcheck is a test helper: it fails a test when a program links
// client-go's clientset, informer factories, apply configurations, discovery
// or an API group it does not use. Their package initialisation registers
// every API group's types (k8s.io/client-go/kubernetes/scheme) when the program
// starts, whichever command runs: that kept 10-15 MiB resident in each pav
// driver (see internal/kube), which runs once per node and provisioner. A new
// import that brings one back fails the program's test, naming the package,
// instead of only the benchmark's memory figures. The manager (cmd/pav), one
// per cluster, links the clientset for client-go's leader election.
package linkcheck

import (
	"os/exec"
	"strings"
	"testing"
)

// NoClientset checks the program in the current directory (a test's, so its
// package's), allowing the API groups listed (e.g. "k8s.io/api/core/v1").
func NoClientset(t *testing.T, program string, allowedAPI ...string) {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	allowed := map[string]bool{}
	for _, a := range allowedAPI {
		allowed[a] = true
	}
	var linked []string
	for _, pkg := range strings.Fields(string(out)) {
		switch {
		case strings.HasPrefix(pkg, "k8s.io/client-go/kubernetes"),
			strings.HasPrefix(pkg, "k8s.io/client-go/informers"),
			strings.HasPrefix(pkg, "k8s.io/client-go/applyconfigurations"),
			strings.HasPrefix(pkg, "k8s.io/client-go/discovery"),
			strings.HasPrefix(pkg, "k8s.io/client-go/tools/leaderelection"),
			strings.HasPrefix(pkg, "k8s.io/api/") && !allowed[pkg]:
			linked = append(linked, pkg)
		}
	}
	if len(linked) > 0 {
		t.Errorf("%s links %d packages it must not, first %s: find the import that brings them "+
			"(go list -deps -f '{{.ImportPath}}: {{.Imports}}' .) and use internal/kube or internal/kube/managerapi instead",
			program, len(linked), linked[0])
	}
}
