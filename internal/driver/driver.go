// Package driver assembles pav-driver (and `pav driver`): the CSI services for
// one PavProvisioner on a unix socket, with the informers they read from, the pod runner, request
// logging through protosanitizer, csi-lib-utils metrics, and an HTTP endpoint for
// health and Prometheus. It reaches the API through internal/kube, never
// client-go's clientset (see there why).
package driver

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/metrics"
	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/controllerserver"
	"github.com/pods-as-volumes/pav/identity"
	"github.com/pods-as-volumes/pav/internal/endrelay"
	"github.com/pods-as-volumes/pav/internal/hostmount"
	"github.com/pods-as-volumes/pav/internal/kube"
	"github.com/pods-as-volumes/pav/internal/kubeconfig"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/internal/provisioner"
	"github.com/pods-as-volumes/pav/internal/records"
	"github.com/pods-as-volumes/pav/internal/templating"
	"github.com/pods-as-volumes/pav/nodeserver"
	"github.com/pods-as-volumes/pav/podrunner"
)

// Modes of `pav driver --mode`.
const (
	ModeController = "controller"
	ModeNode       = "node"
	ModeAll        = "all"
)

// Options are `pav driver`'s flags.
type Options struct {
	Endpoint        string // unix:///csi/csi.sock
	Provisioner     string // the PavProvisioner to serve (watched)
	ProvisionerFile string // or: read it from this file
	NodeID          string
	Mode            string
	Kubeconfig      string // "" = in-cluster
	PodTimeout      time.Duration
	HTTPEndpoint    string // "" = none
	ReportImage     string // "" = this pod's own pav image
	// PodReport is how pods report (--pod-report): auto, exec or sidecar
	// (podrunner.ReportMode).
	PodReport string
	StateDir  string // node: per-volume directories; "" = /var/lib/kubelet/plugins/<name>/volumes
	// PodNamespace is where pods whose template names no namespace go; "" =
	// this pod's namespace ($POD_NAMESPACE), else podrunner.DefaultNamespace.
	PodNamespace string
	// ForgottenGrace (--unstage-forgotten-after): node plugins unstage a
	// staging the kubelet forgot once it went unused this long; 0: never
	// (nodeserver's forgotten.go).
	ForgottenGrace time.Duration
	// StageAhead (--stage-ahead): node plugins stage the volumes of a pod as
	// soon as it is bound to their node (nodeserver's ahead.go).
	StageAhead bool
	// Rate limits the driver's API requests (--kube-api-qps, --kube-api-burst).
	Rate    kubeconfig.Rate
	Version string
}

// Validate checks the flags and names the one to fix.
func (o *Options) Validate() error {
	switch {
	case o.Mode != ModeController && o.Mode != ModeNode && o.Mode != ModeAll:
		return fmt.Errorf("--mode must be controller, node or all, got %q", o.Mode)
	case o.Provisioner == "" && o.ProvisionerFile == "":
		return fmt.Errorf("--provisioner NAME (or --provisioner-file FILE) is required")
	case o.Provisioner != "" && o.ProvisionerFile != "":
		return fmt.Errorf("give --provisioner or --provisioner-file, not both")
	case o.Mode != ModeController && o.NodeID == "":
		return fmt.Errorf("--node-id is required in %s mode (usually the node name, from the downward API)", o.Mode)
	case o.Endpoint == "":
		return fmt.Errorf("--endpoint is required, e.g. unix:///csi/csi.sock")
	case o.PodTimeout < 0:
		return fmt.Errorf("--pod-timeout must not be negative")
	case o.ForgottenGrace < 0:
		return fmt.Errorf("--unstage-forgotten-after must not be negative (0: never)")
	case o.PodNamespace != "" && len(validation.IsDNS1123Label(o.PodNamespace)) > 0:
		return fmt.Errorf("--pod-namespace %q is not a namespace name: %s", o.PodNamespace, strings.Join(validation.IsDNS1123Label(o.PodNamespace), "; "))
	case o.PodReport != "" && o.PodReport != PodReportAuto && o.PodReport != string(podrunner.ReportExec) && o.PodReport != string(podrunner.ReportSidecar):
		return fmt.Errorf("--pod-report must be auto, exec or sidecar, got %q", o.PodReport)
	case o.Rate != (kubeconfig.Rate{}):
		return o.Rate.Validate()
	}
	return nil
}

// PodReportAuto is --pod-report's default: exec where the API server is
// Kubernetes 1.35 or later, whose image volumes are on by default, else
// sidecar. The runner falls back to the sidecar by itself if image volumes
// turn out unsupported after all (see podrunner.Config.Report).
const PodReportAuto = "auto"

// imageVolumesByDefault is the first Kubernetes release with the ImageVolume
// feature gate on by default.
var imageVolumesByDefault = version.MajorMinor(1, 35)

// podReport resolves --pod-report. Node plugins (one per node) do not ask
// the API server's version: their pods report nothing through the API, so
// their wrapper (the exit code in /pav) is only a speed-up, and an API server
// without image volumes refuses the first pod, which the runner then builds
// without the wrapper, with no more requests than that one.
func podReport(ctx context.Context, o Options, client kube.Interface) podrunner.ReportMode {
	if o.PodReport != PodReportAuto && o.PodReport != "" {
		return podrunner.ReportMode(o.PodReport)
	}
	if o.Mode == ModeNode {
		return podrunner.ReportExec
	}
	if client == nil {
		return podrunner.ReportSidecar
	}
	info, err := client.ServerVersion(ctx)
	if err != nil {
		klog.InfoS("Cannot read the API server's version: controller-side pods get the report sidecar", "err", err)
		return podrunner.ReportSidecar
	}
	v, err := version.ParseGeneric(info.GitVersion)
	if err != nil || !v.AtLeast(imageVolumesByDefault) {
		klog.InfoS("The API server predates image volumes by default: controller-side pods get the report sidecar", "version", info.GitVersion)
		return podrunner.ReportSidecar
	}
	return podrunner.ReportExec
}

// DefaultStateDir is the node plugin's state directory (--state-dir) for a
// provisioner: beside the kubelet's plugin sockets, the same path in the
// plugin's container and on the host.
func DefaultStateDir(provisioner string) string {
	return filepath.Join(endrelay.DefaultKubeletDir, "plugins", provisioner, "volumes")
}

// Services are the three CSI services of one driver process.
type Services struct {
	Identity   *identity.Server
	Controller *controllerserver.Server // nil in node mode
	Node       *nodeserver.Server       // nil in controller mode
}

// Deps are what Build needs from outside: real clients in `pav driver`, fakes in
// the sanity suite.
type Deps struct {
	Client kube.Interface // nil: no Kubernetes at all
	// Dynamic watches the PavProvisioner (unless it comes from a file) and,
	// in controller mode, keeps the PavVolume records.
	Dynamic dynamic.Interface
	Runner  *podrunner.Runner
	// Self is this process's own pod, when known (POD_NAME, POD_NAMESPACE).
	Self *corev1.ObjectReference
	// Recorder gets the plugins' events (the node plugin's on claims, the
	// controller plugin's on PVs and on the PavProvisioner); nil = none.
	Recorder record.EventRecorder
}

// Build assembles and starts (informers) the services. It returns once the
// informers have synced.
func Build(ctx context.Context, o Options, d Deps) (*Services, provisioner.Source, error) {
	var src provisioner.Source
	if o.ProvisionerFile != "" {
		p, err := provisioner.LoadFile(o.ProvisionerFile)
		if err != nil {
			return nil, nil, err
		}
		src = provisioner.Static{P: p}
	} else {
		w := provisioner.NewWatch(d.Dynamic, o.Provisioner)
		if err := w.Start(ctx); err != nil {
			return nil, nil, err
		}
		src = w
	}
	name := src.Name()
	var pvcs templating.PVCGetter
	if d.Client != nil {
		pvcs = pvcGetter{d.Client}
	}
	eval := phase.NewEvaluator(pvcs)
	svc := &Services{Identity: &identity.Server{Name: name, Version: o.Version, Controller: o.Mode != ModeNode,
		Ready: newReadiness(src, d.Client).check, Live: live(src), Features: features(src)}}
	if o.Mode != ModeController {
		stateDir := o.StateDir
		if stateDir == "" {
			stateDir = DefaultStateDir(name)
		}
		if err := os.MkdirAll(stateDir, 0o750); err != nil {
			return nil, nil, err
		}
		boot, err := hostmount.BootID()
		if err != nil {
			return nil, nil, err
		}
		svc.Node = &nodeserver.Server{NodeID: o.NodeID, StateDir: stateDir, Source: src, Eval: eval, Pods: d.Runner,
			Client: d.Client, Recorder: d.Recorder, BootID: boot}
		if d.Dynamic != nil {
			// Inline ephemeral volumes: the controller plugin's creation and
			// deletion, run here with this node's pods and records (read by
			// name: the node plugin may not list PavVolumes).
			svc.Node.Inline = &controllerserver.Server{Source: src, Eval: eval, Pods: d.Runner, Client: d.Client,
				Records: records.NewNodeStore(d.Dynamic, name, o.NodeID)}
		}
		// Before the runner starts, so that its initial list reports staging
		// pods that ended while the node plugin was down.
		svc.Node.WatchStagingPods(d.Runner)
	}
	if err := d.Runner.Start(ctx); err != nil {
		return nil, nil, err
	}
	if svc.Node != nil {
		// States an older pav wrote are brought to this one's format first
		// (with the runner's cache: v0.2.0 recorded no pod identity).
		if err := svc.Node.MigrateStates(ctx, name); err != nil {
			return nil, nil, err
		}
		// Staging pods deleted while the node plugin was down left no event.
		svc.Node.Sweep()
		if d.Client != nil {
			svc.Node.ForgottenGrace = o.ForgottenGrace
			svc.Node.WatchNode(ctx, nodeCheckInterval(o.ForgottenGrace))
			// The ends of controller-side pods that run on this node, seen
			// here before the kubelet publishes them.
			relay := endrelay.New(endrelay.Config{Client: d.Client, Namespace: o.PodNamespace, Provisioner: name, Node: o.NodeID})
			if err := relay.Start(ctx); err != nil {
				return nil, nil, err
			}
			// The volumes of the pods bound to this node, staged as soon as
			// they are bound rather than when the kubelet asks.
			if o.StageAhead {
				if err := svc.Node.StageAhead(ctx); err != nil {
					return nil, nil, err
				}
			}
		}
	}
	if o.Mode != ModeNode {
		if d.Dynamic == nil {
			return nil, nil, errors.New("the controller plugin keeps its volume records (PavVolumes) in the Kubernetes API: it needs a dynamic client")
		}
		recs := records.New(d.Dynamic, name)
		if err := recs.Start(ctx); err != nil {
			return nil, nil, err
		}
		snaps := records.NewSnapshots(d.Dynamic, name)
		if err := snaps.Start(ctx); err != nil {
			return nil, nil, err
		}
		groups := records.NewGroupSnapshots(d.Dynamic, name)
		if err := groups.Start(ctx); err != nil {
			return nil, nil, err
		}
		svc.Controller = &controllerserver.Server{Source: src, Eval: eval, Pods: d.Runner, Records: recs, Snapshots: snaps, GroupSnapshots: groups,
			Client: d.Client, Recorder: d.Recorder, Background: ctx, Self: d.Self}
		svc.Controller.SetNodePods(d.Runner)
		if d.Client != nil {
			// Before serving: no operation meets a volume of v0.2.0's
			// without its record, and no new volume takes its handle.
			if err := adoptLegacyVolumes(ctx, svc.Controller, name); err != nil {
				return nil, nil, err
			}
			// The capacity pods an earlier process left: their reports are
			// never read. One that stays (the API did not answer) is
			// removed when its key is next asked for.
			if err := svc.Controller.SweepCapacityPods(ctx); err != nil {
				klog.FromContext(ctx).Error(err, "Cannot remove the capacity pods an earlier process left yet; each goes when its segment is next asked for")
			}
		}
		// Listings of snapshots' blocks nobody came back for.
		go svc.Controller.SweepMetadataListings(ctx)
	}
	return svc, src, nil
}

// nodeCheckInterval is how often the node plugin looks for stagings the
// kubelet forgot and subPath mounts it cannot clean up: a quarter of the
// grace, within [5 s, 15 s] (15 s without a grace). Each look reads the state
// directory and the mount table (nodeserver's forgotten.go, subpaths.go). A
// pod stuck on such a subPath mount waits that long at most, plus the
// kubelet's back-off.
func nodeCheckInterval(grace time.Duration) time.Duration {
	if grace <= 0 {
		return 15 * time.Second
	}
	return min(max(grace/4, 5*time.Second), 15*time.Second)
}

// adoptLegacyVolumes records the volumes v0.2.0 created (controllerserver's
// adopt.go), retrying while the API server does not answer: exiting would
// only crash-loop, and the plugin must not serve before it is done.
func adoptLegacyVolumes(ctx context.Context, s *controllerserver.Server, name string) error {
	var lastErr error
	err := wait.ExponentialBackoffWithContext(ctx, wait.Backoff{Duration: time.Second, Factor: 2, Steps: math.MaxInt32, Cap: 30 * time.Second},
		func(ctx context.Context) (bool, error) {
			var n int
			n, lastErr = s.AdoptLegacyVolumes(ctx, name)
			if lastErr != nil {
				klog.FromContext(ctx).Error(lastErr, "Cannot adopt the volumes v0.2.0 created yet; retrying")
				return false, nil
			}
			if n > 0 {
				klog.FromContext(ctx).Info("Adopted the volumes v0.2.0 created", "volumes", n)
			}
			return true, nil
		})
	if err != nil {
		return fmt.Errorf("adopting the volumes v0.2.0 created: %w (last error: %v)", err, lastErr)
	}
	return nil
}

// live is the driver's liveness (CSI Probe): its PavProvisioner loaded, from
// the informer's cache (the spec in force, the last valid one while an edit is
// invalid): no API request.
func live(src provisioner.Source) func() error {
	return func() error {
		_, err := src.Get(false)
		return err
	}
}

// features reads the optional capabilities from the spec in force (the last
// valid one while an edit is invalid).
func features(src provisioner.Source) func() (phase.Features, error) {
	return func() (phase.Features, error) {
		p, err := src.Get(false)
		if err != nil {
			return phase.Features{}, err
		}
		return phase.FeaturesOf(&p.Spec)
	}
}

// readiness is the driver's readiness: the PavProvisioner loaded and valid,
// and the API server answering (kube.APICheck).
type readiness struct {
	src provisioner.Source
	api *kube.APICheck // nil: no Kubernetes at all
}

func newReadiness(src provisioner.Source, client kube.Interface) *readiness {
	r := &readiness{src: src}
	if client != nil {
		r.api = &kube.APICheck{Client: client}
	}
	return r
}

func (r *readiness) check(ctx context.Context) error {
	if _, err := r.src.Get(false); err != nil {
		return err
	}
	if r.api == nil {
		return nil
	}
	return r.api.Check(ctx)
}

// NewGRPCServer registers the services on a gRPC server whose interceptor logs
// every call (requests through protosanitizer, so secrets never reach a log) and
// records csi_plugin_operations_seconds.
func NewGRPCServer(s *Services, mm metrics.CSIMetricsManager) *grpc.Server {
	srv := grpc.NewServer(grpc.UnaryInterceptor(interceptor(mm)), grpc.StreamInterceptor(streamInterceptor(mm)))
	csi.RegisterIdentityServer(srv, s.Identity)
	if s.Controller != nil {
		csi.RegisterControllerServer(srv, s.Controller)
		// Always served: its capabilities follow the spec
		// (GroupControllerGetCapabilities), as the plugin capability does.
		csi.RegisterGroupControllerServer(srv, s.Controller)
		// Answers FAILED_PRECONDITION without spec.snapshotMetadata, whose
		// capability (SNAPSHOT_METADATA_SERVICE) is then not advertised.
		csi.RegisterSnapshotMetadataServer(srv, s.Controller.SnapshotMetadataServer())
	}
	if s.Node != nil {
		csi.RegisterNodeServer(srv, s.Node)
	} else {
		csi.RegisterNodeServer(srv, controllerNode{})
	}
	return srv
}

// controllerNode is the Node service of a controller plugin: no node RPC but
// NodeGetCapabilities, which says there are none here. external-resizer asks
// the controller's socket for the node capabilities when the driver lacks
// controller EXPAND_VOLUME (a driver that grows volumes on the node only) and
// exits when the service is not there, so that a provisioner with
// volumeModification but no volumeExpansion would never have its volumes
// modified.
type controllerNode struct{ csi.UnimplementedNodeServer }

func (controllerNode) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{}, nil
}

func interceptor(mm metrics.CSIMetricsManager) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		method := info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:]
		logger := klog.FromContext(ctx).WithValues("method", method)
		ctx = klog.NewContext(ctx, logger)
		logger.V(5).Info("CSI request", "request", protosanitizer.StripSecrets(req))
		start := time.Now()
		resp, err := handler(ctx, req)
		if mm != nil {
			mm.RecordMetrics(info.FullMethod, err, time.Since(start))
		}
		if err != nil {
			logger.Error(err, "CSI call failed", "duration", time.Since(start))
		} else {
			logger.V(2).Info("CSI call succeeded", "duration", time.Since(start))
			logger.V(5).Info("CSI response", "response", protosanitizer.StripSecrets(resp))
		}
		return resp, err
	}
}

// streamInterceptor is interceptor for the streaming RPCs (the
// SnapshotMetadata service): every call logged with the request it received,
// and timed to its end.
func streamInterceptor(mm metrics.CSIMetricsManager) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		method := info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:]
		logger := klog.FromContext(ss.Context()).WithValues("method", method)
		start := time.Now()
		err := handler(srv, &loggedStream{ServerStream: ss, ctx: klog.NewContext(ss.Context(), logger)})
		if mm != nil {
			mm.RecordMetrics(info.FullMethod, err, time.Since(start))
		}
		if err != nil {
			logger.Error(err, "CSI call failed", "duration", time.Since(start))
		} else {
			logger.V(2).Info("CSI call succeeded", "duration", time.Since(start))
		}
		return err
	}
}

// loggedStream is a server stream whose context carries the call's logger,
// and which logs the request it receives.
type loggedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *loggedStream) Context() context.Context { return s.ctx }

func (s *loggedStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil {
		klog.FromContext(s.ctx).V(5).Info("CSI request", "request", protosanitizer.StripSecrets(m))
	}
	return err
}

// Listen opens the endpoint: unix:///path (an old socket is removed first) or tcp://host:port.
func Listen(endpoint string) (net.Listener, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, fmt.Errorf("--endpoint %q: %w", endpoint, err)
	}
	switch u.Scheme {
	case "unix":
		path := u.Path
		if path == "" {
			path = u.Host + u.Opaque
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
			return nil, err
		}
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			return nil, fmt.Errorf("removing old socket %s: %w", path, err)
		}
		return net.Listen("unix", path)
	case "tcp":
		return net.Listen("tcp", u.Host)
	}
	return nil, fmt.Errorf("--endpoint %q: use unix:///path/csi.sock or tcp://host:port", endpoint)
}

// Run is `pav driver`: it serves until ctx ends.
func Run(ctx context.Context, o Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	var d Deps
	if o.ProvisionerFile == "" || o.Kubeconfig != "" || os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		var err error
		if d.Client, d.Dynamic, err = NewClients(o.Kubeconfig, o.Rate, o.Version); err != nil {
			return err
		}
	}
	if d.Client == nil {
		return errors.New("pav driver runs pods and needs the Kubernetes API: give --kubeconfig or run in a cluster")
	}
	name := o.Provisioner
	if name == "" {
		p, err := provisioner.LoadFile(o.ProvisionerFile)
		if err != nil {
			return err
		}
		name = p.Name
	}
	if o.PodNamespace == "" {
		o.PodNamespace = os.Getenv("POD_NAMESPACE")
	}
	if o.PodNamespace == "" {
		o.PodNamespace = podrunner.DefaultNamespace
	}

	// The HTTP endpoint comes first: /livez must answer while the rest
	// starts (or waits for the API server), or the kubelet would kill a
	// driver that is merely waiting.
	mm := NewMetricsManager(name)
	var built atomic.Pointer[Services]
	if o.HTTPEndpoint != "" {
		hs := &http.Server{Addr: o.HTTPEndpoint, Handler: healthMux(mm, &built), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := hs.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				klog.ErrorS(err, "HTTP endpoint failed", "address", o.HTTPEndpoint)
			}
		}()
		defer hs.Close()
	}

	if o.ReportImage == "" || o.Mode != ModeNode {
		// This pod: its pav image (for the report sidecar), and the owner of
		// the controller plugin's capacity pods. Retried: the API server may
		// be briefly unreachable at start, and exiting would only crash-loop.
		var self *corev1.Pod
		var lastErr error
		_ = wait.ExponentialBackoffWithContext(ctx, wait.Backoff{Duration: time.Second, Factor: 2, Steps: 8, Cap: 30 * time.Second},
			func(ctx context.Context) (bool, error) {
				self, lastErr = ownPod(ctx, d.Client)
				if lastErr != nil && !errors.Is(lastErr, errNoPodEnv) {
					klog.InfoS("Cannot read this pod to learn the pav image yet", "err", lastErr)
				}
				return lastErr == nil || errors.Is(lastErr, errNoPodEnv), nil
			})
		if self != nil {
			d.Self = &corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: self.Namespace, Name: self.Name, UID: self.UID}
		}
		if o.ReportImage == "" {
			if lastErr == nil {
				o.ReportImage, lastErr = podImage(self)
			}
			if lastErr != nil {
				return fmt.Errorf("cannot tell the pav image for the report sidecar (set --report-image): %w", lastErr)
			}
		}
	}
	runnerNode := ""
	if o.Mode == ModeNode {
		runnerNode = o.NodeID
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(d.Client.EventSink())
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(kube.Scheme, corev1.EventSource{Component: "pav-" + name, Host: o.NodeID})
	d.Recorder = recorder
	report := podReport(ctx, o, d.Client)
	klog.InfoS("Pods report", "by", report, "podReport", o.PodReport)
	d.Runner = podrunner.New(podrunner.Config{Client: d.Client, Provisioner: name, NodeName: runnerNode,
		ReportImage: o.ReportImage, Report: report, PodTimeout: o.PodTimeout, DefaultNamespace: o.PodNamespace, Recorder: recorder})

	svc, _, err := Build(ctx, o, d)
	if err != nil {
		return err
	}
	built.Store(svc)
	lis, err := Listen(o.Endpoint)
	if err != nil {
		return err
	}
	srv := NewGRPCServer(svc, mm)
	go func() {
		<-ctx.Done()
		srv.GracefulStop()
	}()
	klog.InfoS("pav driver serving", "driver", name, "mode", o.Mode, "endpoint", o.Endpoint, "node", o.NodeID,
		"podNamespace", o.PodNamespace, "version", o.Version)
	return srv.Serve(lis)
}

// NewClients builds the driver's API clients (kubeconfig file, else in
// cluster). Their requests are counted in client-go's request metrics, which
// the driver's /metrics serves (see NewMetricsManager).
func NewClients(kubeconfigPath string, rate kubeconfig.Rate, version string) (kube.Interface, dynamic.Interface, error) {
	cfg, err := kubeconfig.Load(kubeconfigPath, rate)
	if err != nil {
		return nil, nil, err
	}
	cfg.UserAgent = "pav-driver/" + version
	client, err := kube.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	return client, dyn, nil
}

// NewMetricsManager is what the driver's /metrics serves: csi-lib-utils'
// csi_plugin_operations_seconds, pav's pod metrics, and client-go's request
// metrics (rest_client_requests_total{code,method,host},
// rest_client_request_duration_seconds, …) with the process and Go collectors
// (process_resident_memory_bytes, …), so that the API requests per volume and
// the memory can be read from outside. The process start time comes from the
// process collector only: two would make the endpoint report a duplicate.
func NewMetricsManager(driverName string) metrics.CSIMetricsManager {
	mm := metrics.NewCSIMetricsManagerWithOptions(driverName,
		metrics.WithSubsystem(metrics.SubsystemPlugin), metrics.WithProcessStartTime(false))
	podrunner.RegisterMetrics(mm.GetRegistry())
	return mm.WithAdditionalRegistry(kubeconfig.Gatherer())
}

// healthMux serves /metrics and the probes:
//
//   - /livez answers 200 as long as the process serves HTTP: it asks nothing of
//     the API server or the PavProvisioner, so that an API outage or an invalid
//     provisioner never gets a driver killed (a restart would not help, and
//     would stop the staging pods' users from being served meanwhile);
//   - /readyz (and its old name /healthz) answers 200 once the services are
//     built (informers synced: pods, records), the PavProvisioner is loaded
//     and valid, and the API server answers (readiness: asked at most once a
//     minute); else 503 with the reason.
func healthMux(mm metrics.CSIMetricsManager, built *atomic.Pointer[Services]) *http.ServeMux {
	mux := http.NewServeMux()
	mm.RegisterToServer(mux, "/metrics")
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	ready := func(w http.ResponseWriter, r *http.Request) {
		svc := built.Load()
		if svc == nil {
			http.Error(w, "starting: informers not synced yet", http.StatusServiceUnavailable)
			return
		}
		if err := svc.Identity.Ready(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	}
	mux.HandleFunc("/readyz", ready)
	mux.HandleFunc("/healthz", ready)
	return mux
}

var errNoPodEnv = errors.New("POD_NAME and POD_NAMESPACE are not set")

// ownPod reads this process's pod (POD_NAME and POD_NAMESPACE from the
// downward API).
func ownPod(ctx context.Context, client kube.Interface) (*corev1.Pod, error) {
	name, ns := os.Getenv("POD_NAME"), os.Getenv("POD_NAMESPACE")
	if name == "" || ns == "" {
		return nil, errNoPodEnv
	}
	return client.Pods(ns).Get(ctx, name, metav1.GetOptions{})
}

// podImage is the image of the pod's container "pav", the one running this
// binary: the report sidecar always matches the driver's version, whatever the
// kustomize image overrides say.
func podImage(pod *corev1.Pod) (string, error) {
	for _, c := range pod.Spec.Containers {
		if c.Name == "pav" {
			return c.Image, nil
		}
	}
	return "", fmt.Errorf("pod %s/%s has no container named pav", pod.Namespace, pod.Name)
}

// pvcGetter serves get_pvc from the API.
type pvcGetter struct{ client kube.Interface }

func (g pvcGetter) GetPVC(ctx context.Context, namespace, name string) (map[string]any, error) {
	pvc, err := g.client.PersistentVolumeClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return phase.ObjectVar(pvc)
}
