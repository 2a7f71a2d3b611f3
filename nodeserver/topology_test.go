package nodeserver

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/kube/kubetest"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/internal/provisioner"
)

// NodeGetInfo needs no mounts: these tests run without root.
func TestNodeGetInfoTopology(t *testing.T) {
	labels := map[string]string{"kubernetes.io/hostname": "worker-1", "topology.kubernetes.io/zone": "eu-1a", "unrelated": "x"}
	for _, c := range []struct {
		name     string
		topology string // spec.topology, "" for none
		capacity bool   // spec.storageCapacity
		client   bool
		want     map[string]string // nil: no accessible topology
		code     codes.Code
		msg      string
	}{
		{name: "without topology: the node ID only", client: true},
		{name: "without topology nor API: the node ID only"},
		// external-provisioner keeps no CSIStorageCapacity of an empty segment.
		{name: "capacity without topology: the provisioner's every-node segment", capacity: true,
			want: map[string]string{"capacity.pav.albertofaria.github.io/local": "true"}},
		{name: "capacity with topology: the topology's segment", capacity: true, topology: "{nodeLabels: [kubernetes.io/hostname]}", client: true,
			want: map[string]string{"kubernetes.io/hostname": "worker-1"}},
		{name: "node-local", topology: "{nodeLabels: [kubernetes.io/hostname]}", client: true,
			want: map[string]string{"kubernetes.io/hostname": "worker-1"}},
		{name: "zonal and node-local", topology: "{nodeLabels: [topology.kubernetes.io/zone, kubernetes.io/hostname]}", client: true,
			want: map[string]string{"kubernetes.io/hostname": "worker-1", "topology.kubernetes.io/zone": "eu-1a"}},
		{name: "a label the node lacks", topology: "{nodeLabels: [kubernetes.io/hostname, example.com/rack]}", client: true,
			code: codes.FailedPrecondition, msg: "node worker-1 has no label example.com/rack, which spec.topology.nodeLabels lists"},
		{name: "topology without the API", topology: "{nodeLabels: [kubernetes.io/hostname]}",
			code: codes.FailedPrecondition, msg: "run it with API access"},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec := "provisioningModes: [Static]\nvolumeStaging: {podTemplate: {spec: {containers: [{name: c, image: b}]}}}\n"
			if c.topology != "" {
				spec += "topology: " + c.topology + "\n"
			}
			if c.capacity {
				spec = strings.Replace(spec, "[Static]", "[Dynamic]", 1) + "volumeCreation: {capacity: 1Mi}\n" +
					"storageCapacity: {podTemplate: {spec: {containers: [{name: c, image: b}]}}}\n"
			}
			p := &v1alpha1.PavProvisioner{ObjectMeta: metav1.ObjectMeta{Name: "local"}}
			if err := yaml.UnmarshalStrict([]byte(spec), &p.Spec); err != nil {
				t.Fatal(err)
			}
			if err := phase.Check(p); err != nil {
				t.Fatal(err)
			}
			s := &Server{NodeID: "worker-1", Source: provisioner.Static{P: p}}
			if c.client {
				s.Client = kubetest.Wrap(fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-1", Labels: labels}}))
			}
			resp, err := s.NodeGetInfo(context.Background(), &csi.NodeGetInfoRequest{})
			if c.code != codes.OK {
				if status.Code(err) != c.code || !strings.Contains(err.Error(), c.msg) {
					t.Fatalf("got %v, want %s containing %q", err, c.code, c.msg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if resp.NodeId != "worker-1" || resp.MaxVolumesPerNode != 0 {
				t.Errorf("node ID %q, max volumes %d; want worker-1, 0 (no limit)", resp.NodeId, resp.MaxVolumesPerNode)
			}
			var got map[string]string
			if resp.AccessibleTopology != nil {
				got = resp.AccessibleTopology.Segments
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("accessible topology %v, want %v", got, c.want)
			}
		})
	}
}

// A node that is not (yet) in the API fails the registration naming the node
// (the registrar retries on its restart).
func TestNodeGetInfoNodeMissing(t *testing.T) {
	p := &v1alpha1.PavProvisioner{ObjectMeta: metav1.ObjectMeta{Name: "local"}, Spec: v1alpha1.PavProvisionerSpec{
		Topology: &v1alpha1.Topology{NodeLabels: []string{"kubernetes.io/hostname"}}}}
	s := &Server{NodeID: "worker-9", Source: provisioner.Static{P: p}, Client: kubetest.Wrap(fake.NewClientset())}
	_, err := s.NodeGetInfo(context.Background(), &csi.NodeGetInfoRequest{})
	if err == nil || !strings.Contains(err.Error(), "reading Node worker-9") {
		t.Fatalf("got %v, want an error naming the node", err)
	}
}

// spec.maxVolumesPerNode is NodeGetInfo's max_volumes_per_node (the kubelet's
// CSINode allocatable count); without it, 0: no limit. It comes with the
// topology, and from the spec in force while an edit is invalid.
func TestNodeGetInfoMaxVolumes(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-1", Labels: map[string]string{"kubernetes.io/hostname": "worker-1"}}}
	for _, c := range []struct {
		name, spec string
		want       int64
		topology   bool
	}{
		{name: "no limit", want: 0},
		{name: "a limit", spec: "maxVolumesPerNode: 16\n", want: 16},
		{name: "the largest", spec: "maxVolumesPerNode: 2147483647\n", want: 2147483647},
		{name: "a limit and topology", spec: "maxVolumesPerNode: 2\ntopology: {nodeLabels: [kubernetes.io/hostname]}\n", want: 2, topology: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec := "provisioningModes: [Static]\nvolumeStaging: {podTemplate: {spec: {containers: [{name: c, image: b}]}}}\n" + c.spec
			p := &v1alpha1.PavProvisioner{ObjectMeta: metav1.ObjectMeta{Name: "local"}}
			if err := yaml.UnmarshalStrict([]byte(spec), &p.Spec); err != nil {
				t.Fatal(err)
			}
			if err := phase.Check(p); err != nil {
				t.Fatal(err)
			}
			s := &Server{NodeID: "worker-1", Source: provisioner.Static{P: p}, Client: kubetest.Wrap(fake.NewClientset(node))}
			resp, err := s.NodeGetInfo(context.Background(), &csi.NodeGetInfoRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if resp.MaxVolumesPerNode != c.want {
				t.Errorf("max volumes per node %d, want %d", resp.MaxVolumesPerNode, c.want)
			}
			if (resp.AccessibleTopology != nil) != c.topology {
				t.Errorf("accessible topology %v", resp.AccessibleTopology)
			}
		})
	}
}

// A limit out of range (which the API server refuses) fails the
// registration naming the field, rather than reach the kubelet.
func TestNodeGetInfoMaxVolumesInvalid(t *testing.T) {
	n := int64(0)
	p := &v1alpha1.PavProvisioner{ObjectMeta: metav1.ObjectMeta{Name: "local"}, Spec: v1alpha1.PavProvisionerSpec{MaxVolumesPerNode: &n}}
	s := &Server{NodeID: "worker-1", Source: provisioner.Static{P: p}}
	_, err := s.NodeGetInfo(context.Background(), &csi.NodeGetInfoRequest{})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "spec.maxVolumesPerNode") {
		t.Fatalf("got %v, want FAILED_PRECONDITION naming spec.maxVolumesPerNode", err)
	}
}
