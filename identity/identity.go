// Package identity is the CSI Identity service: the driver's name (the
// PavProvisioner's), its version, and readiness.
package identity

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/pods-as-volumes/pav/internal/phase"
)

// Server implements csi.IdentityServer.
type Server struct {
	csi.UnimplementedIdentityServer

	Name    string // the CSI driver name = the PavProvisioner's name
	Version string
	// Controller says whether this process serves the Controller service.
	Controller bool
	// Ready reports why the driver cannot serve yet (provisioner not loaded, API
	// unreachable), or nil.
	Ready func(ctx context.Context) error
	// Features reads what the current spec can do beyond PaV, which decides
	// the optional capabilities; nil: none.
	Features func() (phase.Features, error)
}

func (s *Server) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	if s.Name == "" {
		return nil, status.Error(codes.Unavailable, "driver name is not configured")
	}
	return &csi.GetPluginInfoResponse{Name: s.Name, VendorVersion: s.Version}, nil
}

// GetPluginCapabilities advertises the Controller service (when this process
// serves it) and VolumeExpansion (ONLINE or OFFLINE, from
// spec.volumeExpansion.online) when the spec has volumeExpansion.
func (s *Server) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	var caps []*csi.PluginCapability
	if s.Controller {
		caps = append(caps, &csi.PluginCapability{Type: &csi.PluginCapability_Service_{
			Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE},
		}})
	}
	if s.Features != nil {
		f, err := s.Features()
		if err != nil {
			if _, ok := status.FromError(err); !ok {
				err = status.Error(codes.FailedPrecondition, err.Error())
			}
			return nil, err
		}
		if len(f.TopologyKeys) > 0 {
			// external-provisioner then passes accessibility requirements
			// and puts the volume's accessible topology on the PV.
			caps = append(caps, &csi.PluginCapability{Type: &csi.PluginCapability_Service_{
				Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS},
			}})
		}
		if f.Expansion {
			// external-resizer grows a volume in use only when ONLINE;
			// kubelet's node side follows the node capability.
			t := csi.PluginCapability_VolumeExpansion_OFFLINE
			if f.OnlineExpansion {
				t = csi.PluginCapability_VolumeExpansion_ONLINE
			}
			caps = append(caps, &csi.PluginCapability{Type: &csi.PluginCapability_VolumeExpansion_{
				VolumeExpansion: &csi.PluginCapability_VolumeExpansion{Type: t},
			}})
		}
	}
	return &csi.GetPluginCapabilitiesResponse{Capabilities: caps}, nil
}

// Probe answers ready only once the provisioner is loaded and the API answers;
// before that it says why, so `kubectl describe` of a crash-looping plugin shows it.
func (s *Server) Probe(ctx context.Context, _ *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	if s.Ready != nil {
		if err := s.Ready(ctx); err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "not ready: %v", err)
		}
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}
