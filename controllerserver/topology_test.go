package controllerserver

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/podrunner"
)

// wffc is what external-provisioner asks for with WaitForFirstConsumer when
// the scheduler picked node n1: the selected node's segment first.
func wffc(nodes ...string) *csi.TopologyRequirement {
	t := &csi.TopologyRequirement{}
	for _, n := range nodes {
		seg := &csi.Topology{Segments: map[string]string{"kubernetes.io/hostname": n, "zone": "z-" + n}}
		t.Requisite = append(t.Requisite, seg)
		t.Preferred = append(t.Preferred, seg)
	}
	return t
}

func segments(ts []*csi.Topology) []map[string]string {
	var out []map[string]string
	for _, t := range ts {
		out = append(out, t.GetSegments())
	}
	return out
}

func TestCreateVolumeTopology(t *testing.T) {
	nodeLocal := "  topology: {nodeLabels: [kubernetes.io/hostname]}\n"
	// The creation pod puts itself on the selected node, and its command
	// shows what the context said.
	creation := `{podTemplate: {spec: {nodeName: "{{ selectedNode }}", containers: [{name: c, image: busybox, command: [sh, -c, "echo {{ requisiteTopology | length }} {{ preferredTopology | tojson | tobash }}"]}]}}}`
	for _, c := range []struct {
		name     string
		spec     string // added to a Dynamic spec
		creation string // volumeCreation
		answer   map[string]string
		req      *csi.TopologyRequirement
		want     []map[string]string
		nodeName string
		code     codes.Code
		msg      string // with code
	}{
		{name: "node-local: the selected node", spec: nodeLocal, creation: creation, answer: map[string]string{"capacity": "1Gi"},
			req: wffc("n1", "n2"), want: []map[string]string{{"kubernetes.io/hostname": "n1"}}, nodeName: "n1"},
		{name: "/pav/topology wins", spec: nodeLocal, creation: creation, answer: map[string]string{"capacity": "1Gi", "topology": `[{"zone": "z-n1"}, {"zone": "z-n2"}]`},
			req: wffc("n1", "n2"), want: []map[string]string{{"zone": "z-n1"}, {"zone": "z-n2"}}, nodeName: "n1"},
		{name: "accessibleTopology, templated", spec: nodeLocal, creation: `{capacity: 1Gi, accessibleTopology: {zone: "{{ preferredTopology[0].zone }}"}}`,
			req: wffc("n2"), want: []map[string]string{{"zone": "z-n2"}}},
		{name: "no topology in the spec: everywhere", creation: creation, answer: map[string]string{"capacity": "1Gi"},
			req: wffc("n1"), want: nil, nodeName: "n1"},
		{name: "no requirements (no topology in the CO)", spec: nodeLocal, creation: strings.Replace(creation, "{{ selectedNode }}", "{{ selectedNode or '' }}", 1), answer: map[string]string{"capacity": "1Gi"},
			want: nil, nodeName: ""},
		{name: "no selected node for a template that needs one: refused, naming the field", spec: nodeLocal, creation: creation,
			code: codes.InvalidArgument, msg: "spec.volumeCreation.podTemplate.spec.nodeName"},
		{name: "invalid /pav/topology: the creation is reverted, final", spec: nodeLocal, creation: creation, answer: map[string]string{"capacity": "1Gi", "topology": "zone: [a]"},
			req: wffc("n1"), code: codes.Internal, msg: "/pav/topology[0].zone: must be a string"},
		{name: "/pav/topology outside the requisite segments: reverted, RESOURCE_EXHAUSTED (external-provisioner reschedules)", spec: nodeLocal, creation: creation,
			answer: map[string]string{"capacity": "1Gi", "topology": "kubernetes.io/hostname: n2"},
			req:    wffc("n1"), code: codes.ResourceExhausted, msg: "reachable from none of the requisite topology segments"},
		{name: "accessibleTopology outside the requisite segments: nothing made, RESOURCE_EXHAUSTED", spec: nodeLocal,
			creation: `{capacity: 1Gi, accessibleTopology: {kubernetes.io/hostname: n2}}`,
			req:      wffc("n1"), code: codes.ResourceExhausted, msg: "reachable from none of the requisite topology segments"},
	} {
		t.Run(c.name, func(t *testing.T) {
			runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: files(c.answer)}}
			p := prov(t, "  provisioningModes: [Dynamic]\n"+c.spec+"  volumeCreation: "+c.creation+"\n  volumeStaging: "+fmt.Sprintf(pod, "true")+"\n")
			cl := newCluster(t)
			s := cl.server(p, runner)
			ctx := context.Background()
			req := createReq("v1", 1<<20, 0)
			req.AccessibilityRequirements = c.req
			resp, err := s.CreateVolume(ctx, req)
			if c.code != codes.OK {
				if status.Code(err) != c.code || !strings.Contains(err.Error(), c.msg) {
					t.Fatalf("got %v, want %s containing %q", err, c.code, c.msg)
				}
				if c.code == codes.ResourceExhausted {
					// Reverted or never made: no record is left with the old
					// requirements, and a call for another node starts afresh.
					if v := cl.volume("v1"); v != nil {
						t.Fatalf("record left: %+v", v.Status)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := segments(resp.Volume.AccessibleTopology); !reflect.DeepEqual(got, c.want) {
				t.Fatalf("accessible topology %v, want %v", got, c.want)
			}
			for _, op := range runner.ops {
				if op.Phase == v1alpha1.PhaseCreation && op.Template.Spec.NodeName != c.nodeName {
					t.Errorf("creation pod on node %q, want %q", op.Template.Spec.NodeName, c.nodeName)
				}
			}
			v := cl.volume("v1")
			if !reflect.DeepEqual(v.Status.AccessibleTopology, c.want) {
				t.Errorf("recorded accessible topology %v, want %v", v.Status.AccessibleTopology, c.want)
			}
			if (c.req == nil) != (v.Spec.AccessibilityRequirements == nil) {
				t.Errorf("recorded requirements %+v for request %v", v.Spec.AccessibilityRequirements, c.req)
			}
			// A retry, to this process or a restarted one, and one after a
			// reschedule to another node, get the same volume and topology.
			for i, srv := range []*Server{s, cl.server(p, runner)} {
				again := createReq("v1", 1<<20, 0)
				again.AccessibilityRequirements = wffc([]string{"n1", "n3"}[i])
				resp, err := srv.CreateVolume(ctx, again)
				if err != nil {
					t.Fatal(err)
				}
				if got := segments(resp.Volume.AccessibleTopology); !reflect.DeepEqual(got, c.want) {
					t.Fatalf("retry %d: accessible topology %v, want %v", i, got, c.want)
				}
			}
			if n := len(runner.phases()); c.answer != nil && n != 1 {
				t.Fatalf("creation pod ran %d times, want once", n)
			}
		})
	}
}

// A retry while the creation pod still runs (after a restart, and with the
// scheduler having picked another node meanwhile) evaluates the creation
// template with the recorded requirements: the pod stays the same pod, on the
// node creation started with.
func TestCreateVolumeTopologyRecordedForRetries(t *testing.T) {
	running := true
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: func(op podrunner.Operation) (*podrunner.Result, error) {
		if running {
			return nil, context.DeadlineExceeded
		}
		return &podrunner.Result{Files: map[string]string{"capacity": "1Gi"}}, nil
	}}}
	p := prov(t, "  provisioningModes: [Dynamic]\n  topology: {nodeLabels: [kubernetes.io/hostname]}\n"+
		`  volumeCreation: {podTemplate: {spec: {nodeName: "{{ selectedNode }}", containers: [{name: c, image: busybox}]}}}`+"\n  volumeStaging: "+fmt.Sprintf(pod, "true")+"\n")
	cl := newCluster(t)
	ctx := context.Background()
	req := createReq("v1", 1<<20, 0)
	req.AccessibilityRequirements = wffc("n1")
	if _, err := cl.server(p, runner).CreateVolume(ctx, req); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("first call: %v, want DeadlineExceeded (the pod runs)", err)
	}
	running = false
	req.AccessibilityRequirements = wffc("n2")
	resp, err := cl.server(p, runner).CreateVolume(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	want := []map[string]string{{"kubernetes.io/hostname": "n1"}}
	if got := segments(resp.Volume.AccessibleTopology); !reflect.DeepEqual(got, want) {
		t.Fatalf("accessible topology %v, want %v (the recorded request)", got, want)
	}
	for _, op := range runner.ops {
		if op.Template.Spec.NodeName != "n1" {
			t.Fatalf("a creation pod on node %q after the retry, want n1", op.Template.Spec.NodeName)
		}
	}
	if n := len(runner.phases()); n != 1 {
		t.Fatalf("%d creation pods, want 1", n)
	}
}
