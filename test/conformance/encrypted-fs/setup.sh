#!/usr/bin/env bash
# Before the encrypted-fs testdriver runs (hack/conformance.sh): the pool its StorageClass
# names (examples/encrypted-fs, StorageClass parameters), one per node
# (underlyingClaimPerNode): a namespace, the passphrase Secret, and for each node N an
# underlying loop-block claim underlying-N (WaitForFirstConsumer: the first creation pod that
# mounts it, which runs on N, binds it there). Every encrypted volume of the suite is a
# gocryptfs directory on the claim of its node: a pav volume over a pav volume, made on
# whichever node the suite's topology specs allow.
set -euo pipefail
k() { "${KUBECTL:-kubectl}" "$@"; }
k apply -f - >/dev/null <<'YAML'
apiVersion: v1
kind: Namespace
metadata:
  name: pav-conformance-encrypted-fs
---
apiVersion: v1
kind: Secret
metadata:
  name: passphrase
  namespace: pav-conformance-encrypted-fs
stringData:
  passphrase: conformance of a pav volume over a pav volume
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: pav-conformance-encrypted-fs-underlying
provisioner: loop-block
volumeBindingMode: WaitForFirstConsumer
YAML
for node in $(k get nodes -o jsonpath='{.items[*].metadata.name}'); do
  k apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: underlying-$node
  namespace: pav-conformance-encrypted-fs
spec:
  storageClassName: pav-conformance-encrypted-fs-underlying
  volumeMode: Filesystem
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 8Gi
YAML
done
