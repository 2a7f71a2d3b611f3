// Command align keeps the tool modules of hack/tools on one version of every module they share,
// so that a package two tools compile (grpc, protobuf, golang.org/x/sys, client-go …) is
// compiled once and found in the Go build cache by the other: a build-cache entry is keyed by
// the package's source and by every dependency's, so one differing version anywhere below a
// package means a second compilation. Aligned, csi-provisioner, csi-sanity, kwok and e2e.test
// reuse most of what the cluster's binaries compiled, and helm most of the snapshotter's: a
// cold `make demo` and a cold CI run build far less.
//
// Usage (from hack/tools):
//
//	go run ./align           raise, in each group, every shared module to the group's highest
//	                         version (go mod edit -require, go mod tidy), until nothing changes
//	go run ./align -check    exit 1, naming them, if any shared module's versions differ
//
// Groups: the modules on the Kubernetes v1.36 libraries (., e2e, csi, kwok) with containerd and
// etcd (which use Kubernetes libraries of their own: theirs, k8s.io/* and sigs.k8s.io/*, are
// left as they are), and pav's own module, whose versions count but which is never changed
// here (the product's dependencies are chosen for it; the tools follow them, so that the pav
// image's build reuses client-go and the rest); and the modules on the v1.37 libraries
// (snapshotter, helm). Never raised:
// k8s.io/kubernetes (the cluster's version) and the CSI spec (Kubernetes v1.36.3 does not
// build with the newer spec the sidecars need). Versions are compared as `go list -m all` shows
// them after replacements; a module only in the pruned graph of one module (no package of it is
// built) can keep differing, and is not reported.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/mod/semver"
)

type group struct {
	mods   []string
	ownK8s map[string]bool // modules whose k8s.io/* and sigs.k8s.io/* are not aligned
	fixed  map[string]bool // modules whose versions count but are never changed here
}

var groups = []group{
	{
		mods:   []string{"../..", ".", "e2e", "csi", "kwok", "containerd", "etcd"},
		ownK8s: map[string]bool{"containerd": true, "etcd": true},
		fixed:  map[string]bool{"../..": true},
	},
	{mods: []string{"snapshotter", "helm"}},
}

func skip(g group, mod, path string) bool {
	switch {
	case strings.HasPrefix(path, "github.com/pods-as-volumes/"),
		path == "k8s.io/kubernetes",
		path == "github.com/container-storage-interface/spec":
		return true
	case g.ownK8s[mod] && (strings.HasPrefix(path, "k8s.io/") || strings.HasPrefix(path, "sigs.k8s.io/")):
		return true
	}
	return false
}

// versions: path → version of every module in mod's build list (after replacements).
// It runs in a copy of mod's go.mod and go.sum: listing the whole graph adds go.sum lines
// that `go mod tidy` would remove again, and -check must not touch the tree.
func versions(mod string) (map[string]string, error) {
	tmp, err := os.MkdirTemp("", "align-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	for _, f := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(mod, f))
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(tmp, f), b, 0o644); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Path}} {{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}", "all")
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -m all in %s: %w", mod, err)
	}
	v := map[string]string{}
	s := bufio.NewScanner(bytes.NewReader(out))
	for s.Scan() {
		if f := strings.Fields(s.Text()); len(f) == 2 && f[1] != "" {
			v[f[0]] = f[1]
		}
	}
	return v, nil
}

func run(dir string, args ...string) error {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, os.Stderr, os.Stderr
	return cmd.Run()
}

// needed: the modules that provide a package of mod's build (go mod why -m is slow; the
// explicit requirements after tidy are exactly those, direct and indirect).
func needed(mod string) (map[string]bool, error) {
	cmd := exec.Command("go", "mod", "edit", "-json")
	cmd.Dir = mod
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go mod edit -json in %s: %w", mod, err)
	}
	var gomod struct{ Require []struct{ Path string } }
	if err := json.Unmarshal(out, &gomod); err != nil {
		return nil, fmt.Errorf("go mod edit -json in %s: %w", mod, err)
	}
	n := map[string]bool{}
	for _, r := range gomod.Require {
		n[r.Path] = true
	}
	return n, nil
}

func main() {
	check := flag.Bool("check", false, "report differing versions instead of aligning them")
	flag.Parse()
	bad := 0
	for _, g := range groups {
		for round := 1; ; round++ {
			vs := map[string]map[string]string{}
			max := map[string]string{}
			for _, m := range g.mods {
				v, err := versions(m)
				if err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(2)
				}
				vs[m] = v
				for p, ver := range v {
					if !skip(g, m, p) && semver.Compare(ver, max[p]) > 0 {
						max[p] = ver
					}
				}
			}
			changed := false
			for _, m := range g.mods {
				need, err := needed(m)
				if err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(2)
				}
				var raise []string
				for p, ver := range vs[m] {
					if !skip(g, m, p) && need[p] && ver != max[p] {
						raise = append(raise, p+"@"+max[p])
					}
				}
				sort.Strings(raise)
				if len(raise) == 0 || g.fixed[m] {
					continue
				}
				if *check {
					bad += len(raise)
					fmt.Printf("%s: behind its group: %s\n", filepath.Clean(m), strings.Join(raise, " "))
					continue
				}
				changed = true
				fmt.Fprintf(os.Stderr, "align: %s: raising %s\n", m, strings.Join(raise, " "))
				args := []string{"go", "mod", "edit"}
				for _, r := range raise {
					args = append(args, "-require="+r)
				}
				if err := run(m, args...); err != nil {
					os.Exit(2)
				}
				if err := run(m, "go", "mod", "tidy"); err != nil {
					os.Exit(2)
				}
			}
			if !changed || *check {
				break
			}
			if round == 10 {
				fmt.Fprintln(os.Stderr, "align: no fixed point after 10 rounds")
				os.Exit(2)
			}
		}
	}
	if bad > 0 {
		fmt.Println("align: run `cd hack/tools && go run ./align`, then rebuild the tools")
		os.Exit(1)
	}
}
