package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// fakeIdentity is a CSI identity server whose GetPluginInfo fails `failures` times first.
type fakeIdentity struct {
	csi.UnimplementedIdentityServer
	name     string
	failures int32
	calls    atomic.Int32
}

func (f *fakeIdentity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	if f.calls.Add(1) <= f.failures {
		return &csi.GetPluginInfoResponse{}, nil // empty name: not ready yet
	}
	return &csi.GetPluginInfoResponse{Name: f.name, VendorVersion: "test"}, nil
}

// shortDir returns a temporary directory with a short path (unix socket paths are ≤ 107 bytes).
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "reg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func startFakeDriver(t *testing.T, dir string, id *fakeIdentity) string {
	t.Helper()
	sock := filepath.Join(dir, "csi.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, id)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return sock
}

func waitFor(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(path); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s did not appear", path)
}

func dialRegistration(t *testing.T, sock string) registerapi.RegistrationClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return registerapi.NewRegistrationClient(conn)
}

type runResult struct {
	exitCode atomic.Int32
	exited   chan struct{}
	done     chan error
}

func startRegistrar(t *testing.T, ctx context.Context, o options) *runResult {
	t.Helper()
	r := &runResult{exited: make(chan struct{}, 1), done: make(chan error, 1)}
	r.exitCode.Store(-1)
	go func() {
		r.done <- run(ctx, o, func(code int) {
			r.exitCode.Store(int32(code))
			r.exited <- struct{}{}
		})
	}()
	return r
}

func TestRegistration(t *testing.T) {
	dir := shortDir(t)
	regDir := filepath.Join(dir, "registry")
	if err := os.Mkdir(regDir, 0o755); err != nil {
		t.Fatal(err)
	}
	id := &fakeIdentity{name: "hello-world", failures: 2}
	csiSock := startFakeDriver(t, dir, id)
	// A stale socket left by a previous run must be replaced.
	if err := os.WriteFile(filepath.Join(regDir, "hello-world-reg.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o := options{
		csiAddress:              csiSock,
		kubeletRegistrationPath: "/var/lib/kubelet/plugins/hello-world/csi.sock",
		pluginRegistrationPath:  regDir,
		timeout:                 time.Second,
	}
	r := startRegistrar(t, ctx, o)

	regSock := filepath.Join(regDir, "hello-world-reg.sock")
	// The stale file exists from the start; wait until the server answers.
	client := dialRegistration(t, regSock)
	var info *registerapi.PluginInfo
	deadline := time.Now().Add(10 * time.Second)
	for {
		callCtx, c := context.WithTimeout(ctx, time.Second)
		var err error
		info, err = client.GetInfo(callCtx, &registerapi.InfoRequest{})
		c()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GetInfo: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := id.calls.Load(); got < 3 {
		t.Errorf("GetPluginInfo called %d times, want ≥ 3 (two empty answers, then the name)", got)
	}
	if info.Type != registerapi.CSIPlugin || info.Name != "hello-world" ||
		info.Endpoint != o.kubeletRegistrationPath ||
		len(info.SupportedVersions) != 1 || info.SupportedVersions[0] != "1.0.0" {
		t.Errorf("GetInfo = %+v", info)
	}

	if _, err := client.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatalf("NotifyRegistrationStatus(true): %v", err)
	}
	select {
	case <-r.exited:
		t.Fatalf("exited with %d after a successful registration", r.exitCode.Load())
	default:
	}

	cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not stop on cancel")
	}
	if _, err := os.Stat(regSock); !os.IsNotExist(err) {
		t.Errorf("registration socket not removed on exit: %v", err)
	}
}

func TestRegistrationFailureExitsNonZero(t *testing.T) {
	dir := shortDir(t)
	csiSock := startFakeDriver(t, dir, &fakeIdentity{name: "pav-x"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := startRegistrar(t, ctx, options{
		csiAddress:              csiSock,
		kubeletRegistrationPath: "/var/lib/kubelet/plugins/pav-x/csi.sock",
		pluginRegistrationPath:  dir,
		timeout:                 time.Second,
	})
	regSock := filepath.Join(dir, "pav-x-reg.sock")
	waitFor(t, regSock)
	client := dialRegistration(t, regSock)
	_, _ = client.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: false, Error: "boom"})
	select {
	case <-r.exited:
		if code := r.exitCode.Load(); code == 0 {
			t.Errorf("exit code %d, want non-zero", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("registrar did not exit after a failed registration")
	}
}

func TestDriverNameGivesUpWhenCancelled(t *testing.T) {
	dir := shortDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := driverName(ctx, filepath.Join(dir, "missing.sock"), 100*time.Millisecond); err == nil {
		t.Fatal("driverName succeeded without a driver")
	}
}

func TestValidate(t *testing.T) {
	ok := options{csiAddress: "/csi/csi.sock", kubeletRegistrationPath: "/var/lib/kubelet/plugins/x/csi.sock", pluginRegistrationPath: "/registration"}
	if err := ok.validate(); err != nil {
		t.Fatalf("valid options: %v", err)
	}
	for name, o := range map[string]options{
		"no csi address":   {kubeletRegistrationPath: "/a", pluginRegistrationPath: "/r"},
		"no kubelet path":  {csiAddress: "/c", pluginRegistrationPath: "/r"},
		"relative kubelet": {csiAddress: "/c", kubeletRegistrationPath: "a/b", pluginRegistrationPath: "/r"},
	} {
		if err := o.validate(); err == nil {
			t.Errorf("%s: validate succeeded", name)
		}
	}
}
