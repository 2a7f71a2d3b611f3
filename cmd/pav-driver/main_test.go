package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLinksNoClientset keeps the driver's binary off client-go's clientset,
// informer factories and every API group they bring: their package
// initialisation alone kept ~15 MiB resident in each driver process (see
// internal/kube). A new import that brings one back fails here, naming the
// package, instead of only in the benchmark's memory figures.
func TestLinksNoClientset(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	allowedAPI := map[string]bool{"k8s.io/api/core/v1": true, "k8s.io/api/storage/v1": true}
	var linked []string
	for _, pkg := range strings.Fields(string(out)) {
		switch {
		case strings.HasPrefix(pkg, "k8s.io/client-go/kubernetes"),
			strings.HasPrefix(pkg, "k8s.io/client-go/informers"),
			strings.HasPrefix(pkg, "k8s.io/client-go/applyconfigurations"),
			strings.HasPrefix(pkg, "k8s.io/client-go/discovery"),
			strings.HasPrefix(pkg, "k8s.io/api/") && !allowedAPI[pkg]:
			linked = append(linked, pkg)
		}
	}
	if len(linked) > 0 {
		t.Errorf("pav-driver links %d packages it must not, first %s: find the import that brings them "+
			"(go list -deps -f '{{.ImportPath}}: {{.Imports}}' ./cmd/pav-driver) and use internal/kube instead", len(linked), linked[0])
	}
}
