package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

func runCmd(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

func write(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestTemplate(t *testing.T) {
	vars := write(t, "vars.yaml", "name: it's me\nn: 41\nitems: [a, b]\n")
	for _, tc := range []struct {
		name, input, wantOut, wantErr string
		args                          []string
	}{
		{name: "stdin, no vars", input: `{a: "{{ 1 + 2 }}", b: 42, c: ["x", "{% set yaml = true %}{{ 2 * 3 }}"]}`, wantOut: `{"a":"3","b":42,"c":["x",6]}`},
		{name: "vars file", args: []string{"--vars", vars}, input: `cmd: "echo {{ name | tobash }} {{ n + 1 }} {{ items | tojson }}"`,
			wantOut: `{"cmd":"echo 'it'\"'\"'s me' 42 [\"a\", \"b\"]"}`},
		{name: "vars after the file", input: "x: '{{ n }}'", args: []string{"-", "--vars", vars}, wantOut: `{"x":"41"}`},
		{name: "undefined variable", input: `a: {b: ["{{ nope }}"]}`, wantErr: "a.b[0]: "},
		{name: "syntax error", input: `a: "{{"`, wantErr: "a: "},
		{name: "not YAML", input: "a: [", wantErr: "input is not YAML"},
		{name: "missing vars file", args: []string{"--vars", "/nonexistent"}, input: "a: b", wantErr: "--vars"},
		{name: "yaml null drops to null", input: `a: "{% set yaml = true %}"`, wantOut: `{"a":null}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCmd(t, tc.input, append([]string{"template"}, tc.args...)...)
			if tc.wantErr != "" {
				if code != 1 || out != "" || !strings.Contains(errOut, tc.wantErr) {
					t.Fatalf("code %d, stdout %q, stderr %q; want 1, nothing, %q", code, out, errOut, tc.wantErr)
				}
				return
			}
			if code != 0 || strings.TrimSpace(out) != tc.wantOut {
				t.Fatalf("code %d, stdout %s, stderr %s; want %s", code, out, errOut, tc.wantOut)
			}
		})
	}
}

const hello = "../../examples/hello-world/"

func TestRenderHelloWorld(t *testing.T) {
	inputs := []string{"-f", hello + "provisioner.yaml", "--pvc", hello + "testdata/pvc.yaml", "--pv", hello + "testdata/pv.yaml", "--node", hello + "testdata/node.yaml"}
	code, out, errOut := runCmd(t, "", append([]string{"render", "--phase", "staging"}, inputs...)...)
	if code != 0 {
		t.Fatalf("render staging: %d %s", code, errOut)
	}
	var r struct {
		Phase string     `json:"phase"`
		Pod   corev1.Pod `json:"pod"`
	}
	if err := yaml.UnmarshalStrict([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	pod := r.Pod
	if pod.Spec.NodeName != "node-1" || pod.Namespace != "pav" || pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Fatalf("pod placement: node %q namespace %q restart %q", pod.Spec.NodeName, pod.Namespace, pod.Spec.RestartPolicy)
	}
	cmd := strings.Join(pod.Spec.Containers[0].Command, " ")
	if !strings.Contains(cmd, "volume pvc-6f1c2c6e-3b1d-4c36-9d4e-0a8f3e2b9c11 of claim hello-claim.") {
		t.Fatalf("staging command not rendered from the context: %s", cmd)
	}
	var hostPath string
	for _, v := range pod.Spec.Volumes {
		if v.Name == "pav" && v.HostPath != nil {
			hostPath = v.HostPath.Path
		}
	}
	if !strings.HasPrefix(hostPath, "/var/lib/kubelet/plugins/hello-world/volumes/") {
		t.Fatalf("/pav is not the node's per-volume directory: %q", hostPath)
	}
	// The node plugin reads a staging pod's /pav on the host: no sidecar.
	if len(pod.Spec.InitContainers) != 0 {
		t.Fatalf("staging pod with init containers: %+v", pod.Spec.InitContainers)
	}

	code, out, _ = runCmd(t, "", append([]string{"render", "--phase", "creation"}, inputs...)...)
	if code != 0 || !strings.Contains(out, "capacity: 1048576") || !strings.Contains(out, "no pod runs in this phase") {
		t.Fatalf("render creation: %d\n%s", code, out)
	}
	code, out, _ = runCmd(t, "", append([]string{"render", "--phase", "validation"}, inputs...)...)
	if code != 0 || !strings.Contains(out, "the request passes spec.volumeValidation") {
		t.Fatalf("render validation: %d\n%s", code, out)
	}
}

func TestRenderErrors(t *testing.T) {
	bad := write(t, "bad.yaml", "apiVersion: pav.albertofaria.github.io/v1alpha1\nkind: PavProvisioner\nmetadata: {name: x}\nspec:\n  provisioningModes: [Dynamic]\n  volumeCreation: {capacity: 0}\n  volumeStaging: {podTemplate: {spec: {containers: [{name: c, image: b}]}}}\n")
	typo := write(t, "typo.yaml", "apiVersion: pav.albertofaria.github.io/v1alpha1\nkind: PavProvisioner\nmetadata: {name: x}\nspec:\n  provisioningMode: [Dynamic]\n")
	big := write(t, "pvc.yaml", "metadata: {name: c, namespace: default, uid: u}\nspec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Ti}}}\n")
	limited := write(t, "limited.yaml", "apiVersion: pav.albertofaria.github.io/v1alpha1\nkind: PavProvisioner\nmetadata: {name: x}\nspec:\n  provisioningModes: [Dynamic]\n  volumeValidation: {maxCapacity: 1Gi}\n  volumeCreation: {capacity: 1Gi}\n  volumeStaging: {podTemplate: {spec: {containers: [{name: c, image: b}]}}}\n")
	for _, tc := range []struct {
		name    string
		args    []string
		code    int
		wantErr string
		wantOut string
	}{
		{name: "no file", args: []string{"--phase", "staging"}, code: 1, wantErr: "-f provisioner.yaml is required"},
		{name: "creation needs a pvc", args: []string{"-f", hello + "provisioner.yaml", "--phase", "creation"}, code: 1, wantErr: "the creation phase needs --pvc"},
		{name: "staging needs a pv", args: []string{"-f", hello + "provisioner.yaml", "--phase", "staging", "--node", hello + "testdata/node.yaml"}, code: 1, wantErr: "the staging phase needs --pv"},
		{name: "staging needs a node", args: []string{"-f", hello + "provisioner.yaml", "--phase", "staging", "--pv", hello + "testdata/pv.yaml"}, code: 1, wantErr: "the staging phase needs --node"},
		{name: "unknown phase", args: []string{"-f", hello + "provisioner.yaml", "--phase", "mounting"}, code: 1, wantErr: "--phase must be validation"},
		{name: "invalid provisioner", args: []string{"-f", bad, "--phase", "creation"}, code: 1, wantErr: "spec.volumeCreation.capacity: capacity values must be positive"},
		{name: "unknown field", args: []string{"-f", typo, "--phase", "creation"}, code: 1, wantErr: `unknown field "spec.provisioningMode"`},
		{name: "bad param", args: []string{"-f", hello + "provisioner.yaml", "--phase", "creation", "--param", "novalue"}, code: 2, wantErr: "want key=value"},
		{name: "validation reports a rejected request", args: []string{"-f", limited, "--phase", "validation", "--pvc", big}, code: 0, wantOut: "REJECTED: requested capacity 1Ti is above"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCmd(t, "", append([]string{"render"}, tc.args...)...)
			if code != tc.code || !strings.Contains(errOut, tc.wantErr) || !strings.Contains(out, tc.wantOut) {
				t.Fatalf("code %d stderr %q stdout %q; want %d %q %q", code, errOut, out, tc.code, tc.wantErr, tc.wantOut)
			}
		})
	}
}

func TestUsageAndVersion(t *testing.T) {
	if code, _, errOut := runCmd(t, ""); code != 2 || !strings.Contains(errOut, "Usage:") {
		t.Fatalf("no args: %d %q", code, errOut)
	}
	if code, _, errOut := runCmd(t, "", "frobnicate"); code != 2 || !strings.Contains(errOut, `unknown command "frobnicate"`) {
		t.Fatalf("unknown command: %d %q", code, errOut)
	}
	if code, out, _ := runCmd(t, "", "version"); code != 0 || strings.TrimSpace(out) != version {
		t.Fatalf("version: %d %q", code, out)
	}
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"driver"}, "--provisioner NAME (or --provisioner-file FILE) is required"},
		{[]string{"driver", "--provisioner", "x", "--mode", "node"}, "--node-id is required in node mode"},
		{[]string{"driver", "--provisioner", "x", "--mode", "sideways"}, "--mode must be controller, node or all"},
		{[]string{"driver", "--provisioner", "x", "--provisioner-file", "f"}, "not both"},
	} {
		if code, _, errOut := runCmd(t, "", tc.args...); code != 2 || !strings.Contains(errOut, tc.wantErr) {
			t.Errorf("%v: %d %q, want %q", tc.args, code, errOut, tc.wantErr)
		}
	}
}
