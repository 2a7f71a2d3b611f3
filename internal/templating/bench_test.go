package templating

import (
	"context"
	"testing"
)

// benchTree is a realistic volumeStaging phase: a pod template of ~40
// strings, most of them literals, a few with expressions, one YAML field.
func benchTree() map[string]any {
	return map[string]any{
		"podTemplate": map[string]any{
			"metadata": map[string]any{
				"namespace": "pav-system",
				"labels": map[string]any{
					"app.kubernetes.io/name":       "pav-staging",
					"app.kubernetes.io/managed-by": "pav",
					"pav.example.com/volume":       "{{ handle }}",
				},
				"annotations": map[string]any{"pav.example.com/capacity": "{{ capacity }}"},
			},
			"spec": map[string]any{
				"restartPolicy":      "Never",
				"serviceAccountName": "pav-staging",
				"priorityClassName":  "system-node-critical",
				"nodeName":           "{{ node.metadata.name }}",
				"tolerations":        []any{map[string]any{"operator": "Exists"}},
				"initContainers": []any{map[string]any{
					"name":    "prepare",
					"image":   "docker.io/library/busybox:1.36",
					"command": []any{"sh", "-c", "mkdir -p /pav/volume && echo {{ params.bucket | tobash }} > /pav/bucket"},
				}},
				"containers": []any{map[string]any{
					"name":            "gcsfuse",
					"image":           "docker.io/example/gcsfuse:2.4.0",
					"imagePullPolicy": "IfNotPresent",
					"command":         []any{"/bin/sh", "-c"},
					"args": []any{
						"set -euo pipefail\n" +
							"gcsfuse --foreground {% if readOnly %}-o ro {% endif %}" +
							"--implicit-dirs {{ params.bucket | tobash }} /pav/volume &\n" +
							"until mountpoint -q /pav/volume; do sleep 1; done\n" +
							"touch /pav/ready\nwait\n",
					},
					"env": []any{
						map[string]any{"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": "/secrets/key.json"},
						map[string]any{"name": "PVC_NAME", "value": "{{ pvc.metadata.name }}"},
						map[string]any{"name": "PVC_NAMESPACE", "value": "{{ pvc.metadata.namespace }}"},
						map[string]any{"name": "LOG_LEVEL", "value": "info"},
					},
					"securityContext": map[string]any{"privileged": true},
					"resources":       "{% set yaml = true %}{{ {'requests': {'cpu': '100m', 'memory': params.memory | default('128Mi')}} | tojson }}",
					"volumeMounts": []any{
						map[string]any{"name": "secrets", "mountPath": "/secrets", "readOnly": true},
						map[string]any{"name": "fuse", "mountPath": "/dev/fuse"},
					},
					"readinessProbe": map[string]any{
						"exec":                map[string]any{"command": []any{"test", "-e", "/pav/ready"}},
						"periodSeconds":       int64(2),
						"initialDelaySeconds": int64(1),
					},
				}},
				"volumes": []any{
					map[string]any{"name": "secrets", "secret": map[string]any{"secretName": "gcs-credentials"}},
					map[string]any{"name": "fuse", "hostPath": map[string]any{"path": "/dev/fuse", "type": "CharDevice"}},
				},
			},
		},
	}
}

func benchVars() Vars {
	return Vars{
		"volumeMode": "Filesystem", "accessModes": []any{"ReadWriteOnce"}, "capacity": int64(10 << 30),
		"params": map[string]any{"bucket": "my-bucket", "memory": "256Mi"}, "handle": "pvc-3f1e", "readOnly": false,
		"pvc":  map[string]any{"metadata": map[string]any{"name": "data", "namespace": "default", "uid": "3f1e"}},
		"pv":   map[string]any{"metadata": map[string]any{"name": "pvc-3f1e"}},
		"node": map[string]any{"metadata": map[string]any{"name": "worker-1"}},
	}
}

// BenchmarkEvaluate evaluates the whole tree, as pav does for every
// staging; parsed templates come from the cache after the first run.
//
//	go test -run '^$' -bench BenchmarkEvaluate -benchmem ./templating
func BenchmarkEvaluate(b *testing.B) {
	e := New(Options{})
	tree, vars := benchTree(), benchVars()
	if _, err := e.Evaluate(context.Background(), tree, "spec.volumeStaging", vars); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.Evaluate(context.Background(), tree, "spec.volumeStaging", vars); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheck parses the tree's templates without the cache, as when a
// PavProvisioner is loaded for the first time.
func BenchmarkCheck(b *testing.B) {
	tree := benchTree()
	b.ReportAllocs()
	for b.Loop() {
		cache.Clear()
		if err := Check(tree, "spec.volumeStaging"); err != nil {
			b.Fatal(err)
		}
	}
}

func TestBenchTree(t *testing.T) {
	out, err := New(Options{}).Evaluate(context.Background(), benchTree(), "spec.volumeStaging", benchVars())
	if err != nil {
		t.Fatal(err)
	}
	spec := out.(map[string]any)["podTemplate"].(map[string]any)["spec"].(map[string]any)
	c := spec["containers"].([]any)[0].(map[string]any)
	if got := c["args"].([]any)[0]; got != "set -euo pipefail\ngcsfuse --foreground --implicit-dirs my-bucket /pav/volume &\nuntil mountpoint -q /pav/volume; do sleep 1; done\ntouch /pav/ready\nwait" {
		t.Fatalf("args: %q", got)
	}
	if got := c["resources"]; got.(map[string]any)["requests"].(map[string]any)["memory"] != "256Mi" {
		t.Fatalf("resources: %#v", got)
	}
	if spec["nodeName"] != "worker-1" {
		t.Fatalf("nodeName: %#v", spec["nodeName"])
	}
}
