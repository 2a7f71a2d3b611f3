// Command registrar is a TEST-ONLY stand-in for the Kubernetes CSI
// node-driver-registrar sidecar (registry.k8s.io/sig-storage/csi-node-driver-registrar),
// whose source the Go module proxy refuses to serve, so that the local e2e cluster
// (hack/cluster, test/e2e/install) can register pav's node plugin with the kubelet.
// Production deployments use the real node-driver-registrar image (deploy/provisioner).
//
// It behaves like the real registrar, with the same flags:
//
//	--csi-address                the CSI driver's socket inside this container
//	--kubelet-registration-path  the host path of that socket (what the kubelet dials)
//	--plugin-registration-path   the kubelet's plugins_registry directory (default /registration)
//	--timeout                    timeout of each CSI call (default 1s)
//	--http-endpoint              optional address of a /healthz endpoint
//	--v                          klog verbosity
//
// It asks the driver for its name with CSI GetPluginInfo (retrying until the driver
// answers), serves the kubelet plugin registration service
// (k8s.io/kubelet/pkg/apis/pluginregistration/v1) on <plugin-registration-path>/<driver>-reg.sock,
// answers GetInfo with PluginInfo{Type: "CSIPlugin", Name: <driver>, Endpoint:
// <kubelet-registration-path>, SupportedVersions: ["1.0.0"]}, and exits non-zero when the
// kubelet reports that registration failed (so that the container restarts and retries).
// On SIGTERM/SIGINT it removes its socket and exits 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// supportedVersions are the CSI versions announced to the kubelet.
var supportedVersions = []string{"1.0.0"}

type options struct {
	csiAddress              string
	kubeletRegistrationPath string
	pluginRegistrationPath  string
	timeout                 time.Duration
	httpEndpoint            string
}

// parseFlags parses args (without the program name) as
// node-driver-registrar would, klog's flags (--v) included.
func parseFlags(args []string) (options, error) {
	fs := flag.NewFlagSet("csi-node-driver-registrar", flag.ContinueOnError)
	klog.InitFlags(fs)
	var o options
	fs.StringVar(&o.csiAddress, "csi-address", "/run/csi/socket", "Path of the CSI driver socket inside this container.")
	fs.StringVar(&o.kubeletRegistrationPath, "kubelet-registration-path", "", "Path of the CSI driver socket on the host (what the kubelet dials).")
	fs.StringVar(&o.pluginRegistrationPath, "plugin-registration-path", "/registration", "Directory the kubelet watches for plugin registration sockets.")
	fs.DurationVar(&o.timeout, "timeout", time.Second, "Timeout of each CSI call.")
	fs.StringVar(&o.httpEndpoint, "http-endpoint", "", "If set, serve /healthz on this address (e.g. :9809).")
	return o, fs.Parse(args)
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		os.Exit(2)
	}

	if err := o.validate(); err != nil {
		klog.ErrorS(err, "Invalid flags")
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	err = run(ctx, o, func(code int) { os.Exit(code) })
	if err != nil && !errors.Is(err, context.Canceled) {
		klog.ErrorS(err, "Registrar failed")
		os.Exit(1)
	}
}

func (o options) validate() error {
	if o.csiAddress == "" {
		return errors.New("--csi-address is required")
	}
	if o.kubeletRegistrationPath == "" {
		return errors.New("--kubelet-registration-path is required")
	}
	if !filepath.IsAbs(o.kubeletRegistrationPath) {
		return fmt.Errorf("--kubelet-registration-path must be absolute, got %q", o.kubeletRegistrationPath)
	}
	if o.pluginRegistrationPath == "" {
		return errors.New("--plugin-registration-path is required")
	}
	return nil
}

// run discovers the driver name, serves the registration socket until ctx ends
// and returns nil then (after removing the socket). exit is called with a
// non-zero code when the kubelet reports a failed registration.
func run(ctx context.Context, o options, exit func(int)) error {
	driver, err := driverName(ctx, o.csiAddress, o.timeout)
	if err != nil {
		return err
	}
	klog.InfoS("CSI driver found", "name", driver, "csiAddress", o.csiAddress)

	socket := filepath.Join(o.pluginRegistrationPath, driver+"-reg.sock")
	if err := os.Remove(socket); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("removing stale socket %s: %w", socket, err)
	}
	lis, err := net.Listen("unix", socket)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", socket, err)
	}
	defer os.Remove(socket)

	srv := grpc.NewServer()
	reg := &registrationServer{driver: driver, endpoint: o.kubeletRegistrationPath, exit: exit}
	registerapi.RegisterRegistrationServer(srv, reg)
	klog.InfoS("Serving kubelet plugin registration", "socket", socket, "endpoint", o.kubeletRegistrationPath)

	if o.httpEndpoint != "" {
		go serveHealth(ctx, o.httpEndpoint, socket)
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case <-ctx.Done():
		klog.InfoS("Stopping", "reason", ctx.Err())
		srv.Stop()
		<-errc
		return nil
	case err := <-errc:
		return fmt.Errorf("registration server: %w", err)
	}
}

// driverName calls CSI GetPluginInfo on address, retrying (like the real
// registrar) until the driver answers with a name or ctx ends.
func driverName(ctx context.Context, address string, timeout time.Duration) (string, error) {
	target := address
	if !strings.HasPrefix(target, "unix:") {
		target = "unix://" + address
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", fmt.Errorf("connecting to %s: %w", address, err)
	}
	defer conn.Close()
	client := csi.NewIdentityClient(conn)

	delay := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		callCtx, cancel := context.WithTimeout(ctx, timeout)
		resp, err := client.GetPluginInfo(callCtx, &csi.GetPluginInfoRequest{})
		cancel()
		switch {
		case err == nil && resp.GetName() != "":
			return resp.GetName(), nil
		case err == nil:
			err = errors.New("driver returned an empty name")
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		if attempt == 1 || attempt%10 == 0 {
			klog.InfoS("Waiting for the CSI driver", "csiAddress", address, "attempt", attempt, "err", err)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(delay):
		}
		if delay < 2*time.Second {
			delay *= 2
		}
	}
}

type registrationServer struct {
	registerapi.UnimplementedRegistrationServer
	driver   string
	endpoint string
	exit     func(int)
}

func (s *registrationServer) GetInfo(ctx context.Context, _ *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	klog.InfoS("Received GetInfo call")
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              s.driver,
		Endpoint:          s.endpoint,
		SupportedVersions: supportedVersions,
	}, nil
}

func (s *registrationServer) NotifyRegistrationStatus(ctx context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	klog.InfoS("Received NotifyRegistrationStatus call", "registered", st.PluginRegistered, "error", st.Error)
	if !st.PluginRegistered {
		klog.ErrorS(nil, "Registration process failed, exiting so that the container restarts", "error", st.Error)
		s.exit(1)
		return &registerapi.RegistrationStatusResponse{}, nil
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// serveHealth answers /healthz with 200 while the registration socket exists.
func serveHealth(ctx context.Context, addr, socket string) {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if _, err := os.Stat(socket); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	hs := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = hs.Close()
	}()
	if err := hs.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		klog.ErrorS(err, "Health endpoint failed", "address", addr)
	}
}
