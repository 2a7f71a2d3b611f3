package identity

import (
	"context"
	"errors"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pods-as-volumes/pav/internal/phase"
)

func TestIdentity(t *testing.T) {
	ctx := context.Background()
	live := errors.New("PavProvisioner \"x\" is not loaded yet")
	s := &Server{Name: "x", Version: "v1", Controller: true, Live: func() error { return live },
		Ready: func(context.Context) error { return errors.New("the Kubernetes API is not reachable") }}

	info, err := s.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil || info.Name != "x" || info.VendorVersion != "v1" {
		t.Fatalf("GetPluginInfo = %v, %v", info, err)
	}
	caps, err := s.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if err != nil || len(caps.Capabilities) != 1 || caps.Capabilities[0].GetService().GetType() != csi.PluginCapability_Service_CONTROLLER_SERVICE {
		t.Fatalf("GetPluginCapabilities = %v, %v", caps, err)
	}
	// Not live: an answer (the sidecars wait on it), not an error (they
	// would exit).
	if r, err := s.Probe(ctx, &csi.ProbeRequest{}); err != nil || r.GetReady() == nil || r.GetReady().GetValue() {
		t.Fatalf("Probe before the provisioner is loaded = %v, %v; want ready false, no error", r, err)
	}
	// Live while the API server does not answer (Ready fails): an outage
	// must not get the driver restarted.
	live = nil
	if r, err := s.Probe(ctx, &csi.ProbeRequest{}); err != nil || !r.GetReady().GetValue() {
		t.Fatalf("Probe when live = %v, %v", r, err)
	}
	node := &Server{Name: "x"}
	if caps, _ := node.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{}); len(caps.Capabilities) != 0 {
		t.Fatalf("node-only plugin advertises %v", caps.Capabilities)
	}
	if _, err := (&Server{}).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("GetPluginInfo without name: %v", err)
	}
}

func TestTopologyCapability(t *testing.T) {
	ctx := context.Background()
	has := func(caps *csi.GetPluginCapabilitiesResponse) bool {
		for _, c := range caps.GetCapabilities() {
			if c.GetService().GetType() == csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS {
				return true
			}
		}
		return false
	}
	for _, c := range []struct {
		name     string
		features phase.Features
		err      error
		want     bool
		code     codes.Code
	}{
		{name: "with spec.topology", features: phase.Features{TopologyKeys: []string{"kubernetes.io/hostname"}}, want: true},
		{name: "without", features: phase.Features{Expansion: true}},
		{name: "provisioner not loaded: the sidecar retries", err: status.Error(codes.Unavailable, "not loaded"), code: codes.Unavailable},
		{name: "a spec whose features cannot be read", err: errors.New("spec.topology.nodeLabels: must name at least one node label"), code: codes.FailedPrecondition},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &Server{Name: "x", Controller: true, Features: func() (phase.Features, error) { return c.features, c.err }}
			caps, err := s.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
			if c.code != codes.OK {
				if status.Code(err) != c.code {
					t.Fatalf("got %v, want %s", err, c.code)
				}
				return
			}
			if err != nil || has(caps) != c.want || caps.Capabilities[0].GetService().GetType() != csi.PluginCapability_Service_CONTROLLER_SERVICE {
				t.Fatalf("capabilities %v, %v; want VOLUME_ACCESSIBILITY_CONSTRAINTS: %v", caps, err, c.want)
			}
		})
	}
}

func TestVolumeExpansionCapability(t *testing.T) {
	for _, tc := range []struct {
		name     string
		features phase.Features
		err      error
		want     string
		wantCode codes.Code
	}{
		{name: "no expansion", want: ""},
		{name: "online", features: phase.Features{Expansion: true, OnlineExpansion: true}, want: "ONLINE"},
		{name: "offline", features: phase.Features{Expansion: true}, want: "OFFLINE"},
		{name: "node expansion alone advertises nothing here", features: phase.Features{NodeExpansion: true}, want: ""},
		{name: "provisioner not loaded", err: status.Error(codes.Unavailable, "not loaded"), wantCode: codes.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Server{Name: "x", Features: func() (phase.Features, error) { return tc.features, tc.err }}
			caps, err := s.GetPluginCapabilities(context.Background(), &csi.GetPluginCapabilitiesRequest{})
			if status.Code(err) != tc.wantCode {
				t.Fatalf("error %v, want %v", err, tc.wantCode)
			}
			if err != nil {
				return
			}
			got := ""
			for _, c := range caps.Capabilities {
				if e := c.GetVolumeExpansion(); e != nil {
					got += e.GetType().String()
				}
			}
			if got != tc.want {
				t.Fatalf("volume expansion %q, want %q", got, tc.want)
			}
		})
	}
}

// TestGroupControllerCapability: GROUP_CONTROLLER_SERVICE with
// spec.groupSnapshotCreation, and only where the Controller service is.
func TestGroupControllerCapability(t *testing.T) {
	for _, tc := range []struct {
		name       string
		features   phase.Features
		controller bool
		want       bool
	}{
		{name: "group snapshots", features: phase.Features{Snapshots: true, GroupSnapshots: true}, controller: true, want: true},
		{name: "snapshots only", features: phase.Features{Snapshots: true}, controller: true},
		{name: "node plugin", features: phase.Features{Snapshots: true, GroupSnapshots: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Server{Name: "x", Controller: tc.controller, Features: func() (phase.Features, error) { return tc.features, nil }}
			caps, err := s.GetPluginCapabilities(context.Background(), &csi.GetPluginCapabilitiesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			got := false
			for _, c := range caps.Capabilities {
				got = got || c.GetService().GetType() == csi.PluginCapability_Service_GROUP_CONTROLLER_SERVICE
			}
			if got != tc.want {
				t.Fatalf("capabilities %v: GROUP_CONTROLLER_SERVICE %v, want %v", caps.Capabilities, got, tc.want)
			}
		})
	}
}

// SNAPSHOT_METADATA_SERVICE: the controller plugin of a spec with
// snapshotMetadata (the external-snapshot-metadata sidecar requires it); never
// the node plugin.
func TestSnapshotMetadataCapability(t *testing.T) {
	for _, tc := range []struct {
		name       string
		controller bool
		features   phase.Features
		want       bool
	}{
		{"controller with snapshotMetadata", true, phase.Features{Snapshots: true, SnapshotMetadata: true}, true},
		{"controller without", true, phase.Features{Snapshots: true}, false},
		{"node plugin", false, phase.Features{Snapshots: true, SnapshotMetadata: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Server{Name: "x", Controller: tc.controller, Features: func() (phase.Features, error) { return tc.features, nil }}
			caps, err := s.GetPluginCapabilities(context.Background(), &csi.GetPluginCapabilitiesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			got := false
			for _, c := range caps.Capabilities {
				if c.GetService().GetType() == csi.PluginCapability_Service_SNAPSHOT_METADATA_SERVICE {
					got = true
				}
			}
			if got != tc.want {
				t.Errorf("SNAPSHOT_METADATA_SERVICE advertised: %v, want %v", got, tc.want)
			}
		})
	}
}
