// Package identity is the CSI Identity service: the driver's name (the
// PavProvisioner's), its version, and readiness.
package identity

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/klog/v2"

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
	// unreachable), or nil: the readiness of /readyz.
	Ready func(ctx context.Context) error
	// Live reports why the driver is not live (its PavProvisioner was never
	// loaded), or nil: CSI Probe, which the livenessprobe sidecar turns into
	// the driver container's liveness, and which the other sidecars wait on at
	// start. It must ask nothing of the API server: an outage must not get
	// the driver restarted. nil: always live.
	Live func() error
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
// serves it), the GroupController service (when it does and the spec has
// groupSnapshotCreation), the SnapshotMetadata service (the controller plugin,
// with spec.snapshotMetadata) and VolumeExpansion (ONLINE or OFFLINE, from
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
		if f.GroupSnapshots && s.Controller {
			// csi-snapshotter then serves VolumeGroupSnapshots through the
			// GroupController service (CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT).
			caps = append(caps, &csi.PluginCapability{Type: &csi.PluginCapability_Service_{
				Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_GROUP_CONTROLLER_SERVICE},
			}})
		}
		if f.SnapshotMetadata && s.Controller {
			// The external-snapshot-metadata sidecar, in the controller
			// pod, requires it; the node plugin serves no such service.
			caps = append(caps, &csi.PluginCapability{Type: &csi.PluginCapability_Service_{
				Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_SNAPSHOT_METADATA_SERVICE},
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

// Probe is liveness: ready once the driver serves with its PavProvisioner
// loaded, whether or not the API server answers now (the driver serves from
// its caches through an outage, and a restart would only lose them). Not
// ready is an answer, not an error: the sidecars, which probe the driver
// before anything else, then wait (csi-lib-utils' ProbeForever gives up on an
// error, and a sidecar that exits crash-loops); the livenessprobe sidecar
// fails the driver's liveness either way. Readiness, which asks the API
// server, is /readyz's.
func (s *Server) Probe(ctx context.Context, _ *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	if s.Live != nil {
		if err := s.Live(); err != nil {
			klog.FromContext(ctx).V(2).Info("Probe: not ready", "reason", err.Error())
			return &csi.ProbeResponse{Ready: wrapperspb.Bool(false)}, nil
		}
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}
