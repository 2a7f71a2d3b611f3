package identity

import (
	"context"
	"errors"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestIdentity(t *testing.T) {
	ctx := context.Background()
	ready := errors.New("PavProvisioner \"x\" is not loaded yet")
	s := &Server{Name: "x", Version: "v1", Controller: true, Ready: func(context.Context) error { return ready }}

	info, err := s.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil || info.Name != "x" || info.VendorVersion != "v1" {
		t.Fatalf("GetPluginInfo = %v, %v", info, err)
	}
	caps, err := s.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if err != nil || len(caps.Capabilities) != 1 || caps.Capabilities[0].GetService().GetType() != csi.PluginCapability_Service_CONTROLLER_SERVICE {
		t.Fatalf("GetPluginCapabilities = %v, %v", caps, err)
	}
	if _, err := s.Probe(ctx, &csi.ProbeRequest{}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Probe before ready: %v, want FailedPrecondition", err)
	}
	ready = nil
	if r, err := s.Probe(ctx, &csi.ProbeRequest{}); err != nil || !r.GetReady().GetValue() {
		t.Fatalf("Probe when ready = %v, %v", r, err)
	}
	node := &Server{Name: "x"}
	if caps, _ := node.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{}); len(caps.Capabilities) != 0 {
		t.Fatalf("node-only plugin advertises %v", caps.Capabilities)
	}
	if _, err := (&Server{}).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("GetPluginInfo without name: %v", err)
	}
}
