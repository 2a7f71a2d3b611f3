#!/usr/bin/env bash
# Before the encrypted-fs testdriver runs (hack/conformance.sh): the pool its StorageClass
# names (examples/encrypted-fs, StorageClass parameters): a namespace, the passphrase Secret
# and one underlying loop-block claim (WaitForFirstConsumer: the first creation pod that
# mounts it binds it). Every encrypted volume of the suite is a gocryptfs directory on it: a
# pav volume over a pav volume.
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
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: underlying
  namespace: pav-conformance-encrypted-fs
spec:
  storageClassName: pav-conformance-encrypted-fs-underlying
  volumeMode: Filesystem
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 8Gi
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: pav-conformance-encrypted-fs-underlying
provisioner: loop-block
volumeBindingMode: WaitForFirstConsumer
YAML
