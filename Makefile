# pav Makefile.
#
#   make build         build _output/bin/pav (static)
#   make test          unit tests and the in-process csi-sanity suites, with -race
#                      (run as root: the node plugin's tests make real bind mounts)
#   make lint          gofmt, go mod tidy, go vet, and no tracked file over 1 MiB
#   make bench         benchmarks (speed and memory targets live here, not in tests)
#   make fuzz          run each fuzz target for FUZZTIME (default 60s)
#   make e2e           bring the local cluster up if needed, install pav, run test/e2e
#   make bench-e2e     pav vs bare pods, memory, API requests per volume on the local
#                      cluster (BENCH_N=20,100 BENCH_REPS=5); prints a table
#   make bench-peers   pav beside csi-driver-host-path, local-path-provisioner and bare pods
#                      on the local cluster (../shared/peers; BENCH_PEERS_N=20 BENCH_REPS=5);
#                      prints a table with issue 37's targets
#   make bench-volumeperf  Kubernetes' volume performance testsuite (300 claims) for pav-e2e,
#                      loop-block and csi-driver-host-path (test/bench/volumeperf)
#   make bench-scale   pav's controller side with SCALE_NODES (1000) nodes simulated by
#                      kwok: SCALE_PVCS (1000) PVCs at once, Bound, then deleted; prints a table
#   make e2e-upgrade   the upgrade from the last release (test/e2e/upgrade/last-release) to this
#                      tree on the local cluster, with volumes in use (outside make ci)
#   make e2e-outage    the API server down 5 minutes (OUTAGE_DOWN): how soon every pav pod is
#                      Ready again and claims bind after its return (outside make ci)
#   make conformance   Kubernetes' own External Storage e2e tests against pav's provisioners
#                      on the local cluster (hack/conformance.sh; test/conformance)
#   make demo          build what the demo uses, cluster up, install pav, apply hello-world,
#                      provision a volume and print what a pod reads from it (hack/demo.sh)
#   make manifests     render deploy/pav.yaml from deploy/ (kustomize), and the Helm chart
#                      charts/pav from it (go generate ./internal/helmchart)
#   make ci            what .ci/run runs: lint, test, e2e
#
GO        ?= go
# VERSION is pav's release: the manifests in deploy/ name ghcr.io/pods-as-volumes/pav at
# this tag, the Dockerfile builds it by default (TestVersionsAgree keeps them equal).
VERSION   ?= v0.2.0
LDFLAGS   := -s -w -X main.version=$(VERSION)
FUZZTIME  ?= 60s

.PHONY: build test lint bench fuzz ci manifests

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o _output/bin/pav ./cmd/pav
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o _output/bin/pav-driver ./cmd/pav-driver

# test also runs every benchmark once (-benchtime 1x): their targets (the API
# budget, speed, memory) are measured by make bench, but they must not rot.
# It builds helm first (hack/build-tools.sh helm: a few minutes once, then up to date at
# once), for the chart's tests (internal/helmchart): helm lint, and helm template compared
# with deploy/. HELM tells them which binary, and that a missing one is an error. Tests and
# the benchmarks run in one go test: one race build and link per package, not two.
# hack/go-test.sh ends a failed run with a summary of what failed (CI shows the tail).
test:
	hack/build-tools.sh helm
	HELM=$(CURDIR)/_output/bin/helm GO=$(GO) hack/go-test.sh -race -count=1 -bench . -benchtime 1x ./...

# MAX_FILE_BYTES: a tracked file larger than this is almost always a build output
# or a data dump committed by mistake (a 78 MB binary once was); git keeps it in
# every clone forever, so lint refuses it.
MAX_FILE_BYTES := 1048576

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@big=$$(git ls-files -z | xargs -0 -r stat -c '%s %n' 2>/dev/null | awk '$$1 > $(MAX_FILE_BYTES)'); \
	if [ -n "$$big" ]; then echo "tracked files over $(MAX_FILE_BYTES) bytes (bytes, path); untrack them and ignore build outputs in .gitignore:"; echo "$$big"; exit 1; fi
	@diff=$$($(GO) mod tidy -diff 2>&1) || { echo "go.mod or go.sum is not tidy: run go mod tidy (the difference:)"; echo "$$diff"; exit 1; }
	$(GO) vet ./...
	$(GO) vet -tags e2e ./test/e2e
	$(GO) vet -tags bench ./test/bench
	$(GO) vet -tags scale ./test/scale
	cd hack/tools && $(GO) run ./align -check
	hack/update-snapshot-crds.sh --check

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzToBash$$' -fuzztime $(FUZZTIME) ./internal/templating
	$(GO) test -run '^$$' -fuzz '^FuzzEvaluateString$$' -fuzztime $(FUZZTIME) ./internal/templating
	$(GO) test -run '^$$' -fuzz '^FuzzExpressionGrammar$$' -fuzztime $(FUZZTIME) ./internal/templating
	$(GO) test -run '^$$' -fuzz '^FuzzParseCapacity$$' -fuzztime $(FUZZTIME) ./internal/phase

# ci: lint, then the unit tests while e2e-prebuild builds what the e2e needs (the unit tests
# mostly wait on timers and fake kubelets: two cores are 60-70% idle through them), then e2e.
# e2e-prebuild's output goes to _output/e2e-prebuild.log, so that the unit tests' failure
# summary stays at the end of CI's log; its tail is printed if it alone fails.
ci: lint
	@mkdir -p _output; start=$$(date +%s); \
	$(MAKE) --no-print-directory e2e-prebuild > _output/e2e-prebuild.log 2>&1 & pre=$$!; \
	$(MAKE) --no-print-directory test; rc=$$?; \
	wait $$pre; pre=$$?; \
	echo "ci: unit tests (exit $$rc) and e2e-prebuild (exit $$pre) done in $$(( $$(date +%s) - start )) s"; \
	if [ $$rc -eq 0 ] && [ $$pre -ne 0 ]; then echo "the end of _output/e2e-prebuild.log:"; tail -40 _output/e2e-prebuild.log; exit 1; fi; \
	exit $$rc
	$(MAKE) --no-print-directory e2e

# e2e-prebuild: what make e2e builds that needs no cluster, ahead of it: the tools (and the
# conformance suite's e2e.test), every image archive (make e2e imports them; the images
# built from this tree's Go code are built again then, in seconds, the others are up to date),
# and the packages of the Go tests make e2e runs (into Go's build cache: make e2e links them).
e2e-prebuild: tools
	hack/build-tools.sh e2e
	hack/images/build.sh all conformance
	for t in e2e bench scale; do $(GO) test -c -o /dev/null -tags $$t ./test/$$t || exit 1; done
	$(GO) build -o /dev/null ./test/conformance/summary

# deploy/pav.yaml: deploy/ rendered, for `kubectl apply -f` (a test checks it is current).
# charts/pav: the Helm chart, generated from deploy/pav.yaml and deploy/manager/config.yaml
# (deploy/ stays the one source; internal/helmchart's tests check that they agree).
manifests:
	{ echo '# pav $(VERSION), rendered from deploy/ by `make manifests` (kubectl kustomize deploy): do not edit.'; \
	  echo '# Install: kubectl apply -f pav.yaml. Then apply PavProvisioners; see README.md.'; \
	  _output/bin/kubectl kustomize deploy; } > deploy/pav.yaml
	$(GO) generate ./internal/helmchart

# Local cluster targets (run as root):
#   make tools         build kube-*, kubectl, containerd, etcd, csi-provisioner, csi-sanity,
#                      csi-snapshotter, snapshot-controller, rclone, kwok, helm
#                      into _output/bin (hack/build-tools.sh; ≈10 min cold, skips what is
#                      up to date) after installing the Debian packages (hack/install-deps.sh)
#   make images        build the pav.local/*:dev (pav, the test stand-ins, the examples'
#                      images) and registry.k8s.io/pause:3.10 images
#                      (hack/images/build.sh); also imports them if the cluster is up
#   make cluster-up    start the local cluster, NODES nodes (hack/cluster/up.sh);
#                      then: export KUBECONFIG=$(CURDIR)/_output/cluster/kubeconfig
#   make cluster-down  stop it and clean up everything it made (hack/cluster/down.sh)
#   make install       install pav on the local cluster as a user would: deploy/ with the
#                      local images (test/e2e/install), manager restarted onto the fresh image
#   make deploy-e2e    install, then apply the pav-e2e and the examples' PavProvisioners and
#                      wait until they are Ready (hack/install-local.sh)

CLUSTER_DIR ?= $(CURDIR)/_output/cluster
# NODES: the local cluster's nodes (make cluster-up NODES=3, make demo NODES=3, make e2e
# NODES=3): node 1 is this machine, nodes 2..NODES run in namespaces (hack/cluster/node.sh).
# The e2e suite's cross-node tests fail instead of skipping when NODES says they can run.
NODES ?= 1
export PAV_NODES := $(NODES)
export PAV_E2E_NODES := $(NODES)

.PHONY: tools images cluster-up cluster-down install deploy-e2e e2e-setup e2e bench-e2e demo
.PHONY: bench-scale bench-peers bench-volumeperf bench-volumeperf-smoke conformance e2e-multinode e2e-prebuild

tools:
	hack/install-deps.sh
	hack/build-tools.sh

images:
	@if [ -S $(CLUSTER_DIR)/run/containerd/containerd.sock ]; then \
		hack/images/build.sh --import; \
	else \
		hack/images/build.sh; \
	fi

cluster-up:
	PAV_CLUSTER_DIR=$(CLUSTER_DIR) hack/cluster/up.sh

cluster-down:
	PAV_CLUSTER_DIR=$(CLUSTER_DIR) hack/cluster/down.sh

install:
	PAV_CLUSTER_DIR=$(CLUSTER_DIR) hack/install-local.sh

deploy-e2e:
	PAV_CLUSTER_DIR=$(CLUSTER_DIR) hack/install-local.sh test/e2e/pav-e2e/provisioner.yaml examples/*/provisioner.yaml

# e2e-setup: everything the e2e suite needs, idempotent: tools, the cluster, fresh
# images (the pav image is rebuilt from this tree), pav installed, both provisioners Ready.
e2e-setup: tools cluster-up images deploy-e2e

# The suite runs its tests in lanes (PAV_E2E_PARALLEL=1, test/e2e/framework_test.go): tests
# of different provisioners at once, those that disturb the cluster alone.
# e2e also runs the smoke forms of bench-e2e (2 volumes, one repetition), bench-peers (2 pairs
# at once, one repetition), bench-scale (20 simulated nodes, 10 claims) and, after the
# conformance smoke, bench-volumeperf (pav-e2e, 4 claims) so that the
# benchmarks cannot rot; their figures mean nothing, so the first three run at once (they mostly wait on
# pods; each has its own provisioner, classes and namespaces, and waits only for its own
# volumes; the scale smoke's simulated nodes are tainted, so the benches' pods and the peers'
# never go there).
e2e: e2e-setup
	@echo "the bench, bench-peers and scale smokes, at once (output: _output/bench-smoke.log, _output/bench-peers-smoke.log, _output/scale-smoke.log)"; \
	KUBECONFIG=$(CLUSTER_DIR)/kubeconfig PAV_BENCH_N=2 PAV_BENCH_REPS=1 $(GO) test -tags bench -count=1 -timeout 10m -v -run '^TestBench$$' ./test/bench/ > _output/bench-smoke.log 2>&1 & bench=$$!; \
	$(BENCH_PEERS_ENV) PAV_BENCH_PEERS_N=2 PAV_BENCH_REPS=1 PAV_BENCH_PEERS_TIMEOUT=12m $(GO) test -tags bench -count=1 -timeout 15m -v -run '^TestBenchPeers$$' ./test/bench/ > _output/bench-peers-smoke.log 2>&1 & peers=$$!; \
	KUBECONFIG=$(CLUSTER_DIR)/kubeconfig PAV_SCALE_NODES=20 PAV_SCALE_PVCS=10 PAV_SCALE_TIMEOUT=5m $(GO) test -tags scale -count=1 -timeout 10m -v -run '^TestScale$$' ./test/scale/ > _output/scale-smoke.log 2>&1; scale=$$?; \
	wait $$bench; bench=$$?; wait $$peers; peers=$$?; \
	cat _output/bench-smoke.log _output/bench-peers-smoke.log _output/scale-smoke.log; \
	echo "bench smoke: exit $$bench; bench-peers smoke: exit $$peers; scale smoke: exit $$scale"; \
	[ $$bench -eq 0 ] && [ $$peers -eq 0 ] && [ $$scale -eq 0 ]
	PAV_CLUSTER_DIR=$(CLUSTER_DIR) CONFORMANCE_OUT=$(CURDIR)/_output/conformance-smoke CONFORMANCE_FOCUS='$(CONFORMANCE_SMOKE)' CONFORMANCE_SKIP='$(CONFORMANCE_SMOKE_SKIP)' CONFORMANCE_PROCS=$(CONFORMANCE_SMOKE_PROCS) hack/conformance.sh
	$(MAKE) --no-print-directory bench-volumeperf-smoke
	KUBECONFIG=$(CLUSTER_DIR)/kubeconfig PAV_E2E_PARALLEL=1 GO=$(GO) GO_TEST_LOG=_output/e2e.log hack/go-test.sh -tags e2e -count=1 -timeout 40m -v ./test/e2e/
	KUBECONFIG=$(CLUSTER_DIR)/kubeconfig PAV_SOAK=1 SOAK_LIFECYCLES=6 SOAK_CONCURRENCY=3 SOAK_FAULTS=controller,phasepod GO=$(GO) GO_TEST_LOG=_output/soak-smoke.log hack/go-test.sh -tags e2e -count=1 -timeout 15m -v -run '^TestSoak$$' ./test/e2e/
	@if [ "$(NODES)" -lt 3 ]; then $(MAKE) --no-print-directory e2e-multinode; fi

# soak: volume lifecycles under random faults on the local cluster (test/e2e/soak_test.go;
# docs/development.md#the-soak), outside make ci; make e2e runs a smoke form (6 lifecycles,
# two kinds of fault). SOAK_SEED (default: the time, printed) replays a run's schedule;
# SOAK_FAULTS (default: all) is a comma-separated list of controller, node, manager,
# kubelet, apiserver, phasepod, or none.
SOAK_LIFECYCLES  ?= 200
SOAK_CONCURRENCY ?= 4
SOAK_SEED        ?=
SOAK_FAULTS      ?=
.PHONY: soak
soak: e2e-setup
	KUBECONFIG=$(CLUSTER_DIR)/kubeconfig PAV_SOAK=1 SOAK_LIFECYCLES='$(SOAK_LIFECYCLES)' SOAK_CONCURRENCY='$(SOAK_CONCURRENCY)' SOAK_SEED='$(SOAK_SEED)' SOAK_FAULTS='$(SOAK_FAULTS)' GO=$(GO) GO_TEST_LOG=_output/soak.log hack/go-test.sh -tags e2e -count=1 -timeout 8h -v -run '^TestSoak$$' ./test/e2e/

# e2e-upgrade: the upgrade from the last release (test/e2e/upgrade/last-release) to this tree
# on the local cluster (test/e2e/upgrade_test.go; docs/development.md#the-upgrade-test), outside
# make ci (6 minutes on 2 cores, the test 4 of them): hack/upgrade-from.sh builds the release's
# images from its own tree, then the test uninstalls pav, installs the release, makes volumes in
# use, upgrades, and reinstalls pav as make deploy-e2e does.
.PHONY: e2e-upgrade
e2e-upgrade: e2e-setup
	KUBECONFIG=$(CLUSTER_DIR)/kubeconfig PAV_CLUSTER_DIR=$(CLUSTER_DIR) PAV_UPGRADE=1 GO=$(GO) GO_TEST_LOG=_output/upgrade.log hack/go-test.sh -tags e2e -count=1 -timeout 40m -v -run '^TestUpgrade$$' ./test/e2e/

# e2e-outage: the API server killed and kept down for OUTAGE_DOWN (5m) on the local cluster
# (test/e2e/outage_test.go; docs/development.md#the-outage-test), outside make ci (some 9
# minutes): every pav pod must be Ready within 60 s of its return, and two claims (one whose
# creation pod ran through the outage, one requested during it) Bound within 2 minutes; it
# prints the times it measured per pod kind and claim.
OUTAGE_DOWN ?= 5m
.PHONY: e2e-outage
e2e-outage: e2e-setup
	KUBECONFIG=$(CLUSTER_DIR)/kubeconfig PAV_CLUSTER_DIR=$(CLUSTER_DIR) PAV_OUTAGE=1 PAV_OUTAGE_DOWN='$(OUTAGE_DOWN)' GO=$(GO) GO_TEST_LOG=_output/outage.log hack/go-test.sh -tags e2e -count=1 -timeout 40m -v -run '^TestOutage$$' ./test/e2e/

# e2e-multinode: the cross-node tests on 3 nodes; on a smaller cluster it boots nodes 2 and 3
# for them and removes them afterwards (hack/e2e-multinode.sh). make e2e runs it when NODES < 3
# (with NODES=3 the suite itself runs them).
e2e-multinode:
	PAV_CLUSTER_DIR=$(CLUSTER_DIR) GO=$(GO) hack/e2e-multinode.sh

# conformance: Kubernetes' own External Storage e2e suite (k8s.io/kubernetes v1.36.3's
# e2e.test, built here with its images) against every testdriver of test/conformance, on the
# local cluster; _output/conformance/summary.md says what passed, failed and was skipped, and
# why (docs/conformance.md). CONFORMANCE_DRIVERS picks drivers; see hack/conformance.sh for
# the other settings. make e2e runs CONFORMANCE_SMOKE, a few specs per driver.
CONFORMANCE_DRIVERS ?=
CONFORMANCE_SMOKE   ?= provisioning should provision storage with defaults|volumes should store data|capacity provides storage capacity information|should verify that all csinodes have volume limits|CSI Ephemeral-volume.*should create read/write inline ephemeral volume|volume-modify .*should modify volume that already has a VAC|\[Testpattern:  \(delete policy\)\] volumegroupsnapshottable
# The smoke's group snapshot spec is pav-e2e's (make conformance runs loop-block's too).
# No single quotes in it: it is passed in single quotes.
CONFORMANCE_SMOKE_SKIP ?= \[Driver: loop-block\].*volumegroupsnapshottable=the smoke runs the group snapshot spec of pav-e2e only (make conformance runs that of loop-block)
# the smoke's specs, 9 at a time: they mostly wait on pods
CONFORMANCE_SMOKE_PROCS ?= 9
conformance: e2e-setup
	PAV_CLUSTER_DIR=$(CLUSTER_DIR) hack/conformance.sh $(CONFORMANCE_DRIVERS)

# bench-e2e: pav's overhead over bare pods, its memory and API requests per
# volume on the local cluster, measured in one run, printed as a table
# (test/bench; docs/performance.md). BENCH_N=20,100 also runs 100 at once.
BENCH_N    ?= 20
BENCH_REPS ?= 5
bench-e2e: e2e-setup
	KUBECONFIG=$(CLUSTER_DIR)/kubeconfig PAV_BENCH_N=$(BENCH_N) PAV_BENCH_REPS=$(BENCH_REPS) $(GO) test -tags bench -count=1 -timeout 60m -v -run '^TestBench$$' ./test/bench/

# bench-peers: pav beside csi-driver-host-path and local-path-provisioner (PEERS_DIR: their
# install scripts and images, ../shared/peers) and bare pods, interleaved in one run: a pod and
# its new claim → Running, BENCH_PEERS_N pairs at once, their deletion; medians of BENCH_REPS
# (BENCH_LOCALPATH_REPS for local-path, 0 to leave it out), the table with issue 37's targets and the timelines of
# the median runs, also in _output/bench-peers.md (test/bench/peers_test.go;
# docs/performance.md). It installs the peers and uninstalls them at the end.
PEERS_DIR            ?= $(abspath $(CURDIR)/../shared/peers)
BENCH_PEERS_N        ?= 20
BENCH_LOCALPATH_REPS ?= $(BENCH_REPS)
BENCH_PEERS_ENV = KUBECONFIG=$(CLUSTER_DIR)/kubeconfig PAV_CLUSTER_DIR=$(CLUSTER_DIR) PAV_BIN_DIR=$(CURDIR)/_output/bin PAV_PEERS_DIR=$(PEERS_DIR)
bench-peers: e2e-setup
	$(BENCH_PEERS_ENV) PAV_BENCH_PEERS_N=$(BENCH_PEERS_N) PAV_BENCH_REPS=$(BENCH_REPS) PAV_BENCH_LOCALPATH_REPS=$(BENCH_LOCALPATH_REPS) PAV_BENCH_PEERS_OUT=$(CURDIR)/_output/bench-peers.md $(GO) test -tags bench -count=1 -timeout 100m -v -run '^TestBenchPeers$$' ./test/bench/

# bench-volumeperf: Kubernetes' own volume performance testsuite (volumeperf.go: 300 claims at
# once → Bound, average latency and throughput against csi-driver-host-path's regression limits,
# 2 min and 0.5 claims/s) for pav-e2e, loop-block and csi-driver-host-path (installed by
# PEERS_DIR's script for the run) on the same cluster, one after the other, through
# hack/conformance.sh and the testdrivers of test/bench/volumeperf; the figures, side by side,
# in _output/volumeperf/table.md (docs/performance.md). It fails when a pav driver does not pass
# (table.sh); host-path over its own limits is reported, not a failure. About 15 minutes a driver
# on 2 cores: the suite's cleanup deletes the 300 claims one at a time.
VOLUMEPERF_DRIVERS ?= pav-e2e loop-block hostpath
# volumeperf OUT,DRIVERS: the suite's volume-lifecycle-performance specs for the testdriver
# folders DRIVERS into OUT, then their table (OUT/table.md), whose verdict is the recipe's:
# table.sh fails when a pav driver did not pass, not for a peer over its own limits.
volumeperf = mkdir -p $(1); rm -f $(1)/report.json; PAV_CLUSTER_DIR=$(CLUSTER_DIR) PAV_PEERS_DIR=$(PEERS_DIR) CONFORMANCE_OUT=$(1) CONFORMANCE_PROCS=1 \
	  CONFORMANCE_FOCUS='volume-lifecycle-performance' hack/conformance.sh $(2) || true; \
	test/bench/volumeperf/table.sh $(1)/report.json > $(1)/table.md; rc=$$?; cat $(1)/table.md; exit $$rc
bench-volumeperf: e2e-setup
	$(call volumeperf,$(CURDIR)/_output/volumeperf,$(addprefix test/bench/volumeperf/,$(VOLUMEPERF_DRIVERS)))

# bench-volumeperf-smoke: the same suite for pav-e2e with 4 claims (make e2e runs it, so that the
# testdriver and table.sh cannot rot; its figures mean nothing).
bench-volumeperf-smoke:
	rm -rf _output/volumeperf-smoke; mkdir -p _output/volumeperf-smoke/pav-e2e
	sed 's/^\( *Count:\).*/\1 4/' test/bench/volumeperf/pav-e2e/testdriver.yaml > _output/volumeperf-smoke/pav-e2e/testdriver.yaml
	$(call volumeperf,$(CURDIR)/_output/volumeperf-smoke/out,_output/volumeperf-smoke/pav-e2e)

# bench-scale: pav's controller side at scale, simulated (test/scale;
# docs/performance.md): kwok simulates SCALE_NODES nodes against the real local API server,
# SCALE_PVCS claims are created at once (their validation and creation pods completed by
# kwok), Bound, then deleted; prints throughput, each step's timeline, memory and CPU,
# pav's and the API server's requests. make e2e runs a smoke form (20 nodes, 10 PVCs).
SCALE_NODES ?= 1000
SCALE_PVCS  ?= 1000
bench-scale: e2e-setup
	KUBECONFIG=$(CLUSTER_DIR)/kubeconfig PAV_SCALE_NODES=$(SCALE_NODES) PAV_SCALE_PVCS=$(SCALE_PVCS) $(GO) test -tags scale -count=1 -timeout 120m -v -run '^TestScale$$' ./test/scale/

# demo: what a user does: install pav, apply one PavProvisioner, use it. It builds only what
# that uses (the cluster's binaries, external-provisioner, the pav, registrar, busybox and
# pause images: not make tools and make images, which build for e2e, the benchmarks and
# conformance too), and says how long each step took (hack/demo.sh).
demo:
	PAV_CLUSTER_DIR=$(CLUSTER_DIR) hack/demo.sh
