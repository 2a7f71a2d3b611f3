// Package e2e proves pav on a real Kubernetes on this machine (hack/cluster/up.sh; one node,
// or three with NODES=3, for multinode_test.go's cross-node tests):
// pav installed as a user installs it (install/: deploy/ with the local images),
// the pav-e2e provisioner (pav-e2e/provisioner.yaml) applied alone and deployed
// by the pav manager with the stock external-provisioner, real kubelet CSI calls,
// real pods, mounts and loop devices. Every test has its own namespace and cleans
// up after itself; the assertions are on real objects, events and files on the
// node. manager_test.go covers the manager, systemtests_test.go reproduces PaV's
// own system tests, and zz_uninstall_test.go (last) uninstalls and reinstalls.
//
// The tests carry the build tag e2e, so `go test ./...` does not need a cluster:
//
//	make e2e                                       # cluster up if needed, deploy, run
//	go test -tags e2e ./test/e2e -run BlockVolume  # one case, once deployed
package e2e
