# pav Makefile. Local cluster targets (run as root):
#   make tools         build kube-*, kubectl, containerd, etcd, csi-provisioner, csi-sanity
#                      into _output/bin (hack/build-tools.sh; ≈10 min cold, skips what is
#                      up to date) after installing the Debian packages (hack/install-deps.sh)
#   make images        build the pav.local/*:dev, registry.k8s.io/pause:3.10 images
#                      (hack/images/build.sh); also imports them if the cluster is up
#   make cluster-up    start the single-node cluster (hack/cluster/up.sh);
#                      then: export KUBECONFIG=$(CURDIR)/_output/cluster/kubeconfig
#   make cluster-down  stop it and clean up everything it made (hack/cluster/down.sh)
#   make deploy-e2e    apply deploy/base and test/e2e/overlay to the local cluster

CLUSTER_DIR ?= $(CURDIR)/_output/cluster
KUBECTL     := $(CURDIR)/_output/bin/kubectl --kubeconfig $(CLUSTER_DIR)/kubeconfig

.PHONY: tools images cluster-up cluster-down deploy-e2e

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

deploy-e2e:
	$(KUBECTL) apply -k deploy/base
	$(KUBECTL) wait --for condition=established --timeout=60s crd/pavprovisioners.pav.albertofaria.github.io
	$(KUBECTL) apply -k test/e2e/overlay
