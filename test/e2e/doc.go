// Package e2e proves pav on a real single-node Kubernetes (hack/cluster/up.sh):
// the pav-e2e provisioner (pav-e2e/provisioner.yaml) deployed by `make e2e` with
// the stock external-provisioner, real kubelet CSI calls, real pods, mounts and
// loop devices. Every test has its own namespace and cleans up after itself; the
// assertions are on real objects, events and files on the node.
//
// The tests carry the build tag e2e, so `go test ./...` does not need a cluster:
//
//	make e2e                                       # cluster up if needed, deploy, run
//	go test -tags e2e ./test/e2e -run BlockVolume  # one case, once deployed
package e2e
