//go:build scale

// Package scale is `make bench-scale`: pav's controller side at the scale of a large
// cluster, simulated (issue 10, "Toward internet scale, by simulation"). Against the
// local cluster's real API server, etcd, controller-manager and scheduler, with pav
// installed (make e2e-setup), it
//
//   - starts kwok (_output/bin/kwok, built by make tools) with the stages in kwok/: kwok
//     manages only the nodes this test creates;
//   - creates PAV_SCALE_NODES (1000) simulated nodes, tainted kwok.x-k8s.io/node so that
//     only pods that tolerate it go there, and waits until they are Ready and every
//     DaemonSet in pav's namespace has settled on them;
//   - applies the PavProvisioner pav-sim (provisioner.yaml: validation, creation and
//     deletion pods that select the simulated nodes, where kwok completes them with a pav
//     report) and a StorageClass for it;
//   - creates PAV_SCALE_PVCS (1000) claims at once, waits (by informers) until all are
//     Bound, deletes them all and waits until every PV is gone;
//
// and prints what it measured: throughput, the timeline of each step of a volume's
// creation and deletion (which step the volumes queue at), the RSS and CPU of the pav-sim
// controller plugin, external-provisioner, the manager, kwok and the control plane
// (from /proc: a single-node cluster, run as root on the node), the API requests pav's
// controller made per volume and the time its client waited on its own rate limiter,
// and the API server's requests by verb and resource. Everything it made (provisioner,
// StorageClass, namespace, nodes, leftover pods, kwok) is removed afterwards, also when it
// fails or is interrupted.
//
//	make bench-scale                               # 1000 nodes, 1000 PVCs
//	make bench-scale SCALE_NODES=200 SCALE_PVCS=500
//	PAV_SCALE_NODES=20 PAV_SCALE_PVCS=10 ...       # the smoke form make e2e runs
//
// Only the controller side is simulated: no claim is ever used by a pod, so staging never
// runs; kwok's pods run no container, so the cost measured is pav's and Kubernetes', not
// the storage's.
package scale

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

const (
	provisionerName = "pav-sim"
	pavNS           = "pav"
	mib             = 1 << 20
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// sim is one run: the clients, what it made, and what it measured.
type sim struct {
	t      *testing.T
	cfg    *rest.Config
	client kubernetes.Interface
	dyn    dynamic.Interface
	root   string // the repository
	logDir string // kwok's log and the run's report

	nodes, pvcs int
	ns          string // the claims' namespace
	kwok        *exec.Cmd
	kwokExit    chan error

	rec   *recorder
	procs []*proc
	out   *report

	ctrlPod, managerPod *corev1.Pod // pav-sim's controller plugin, the manager
	kcmLog              string      // the controller-manager's log file
}

func TestScale(t *testing.T) {
	kc := os.Getenv("KUBECONFIG")
	if kc == "" {
		t.Skip("KUBECONFIG is not set: make bench-scale runs this against the local cluster")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	// The test's own requests (1,000 claims created at once, informers) must not be
	// what the run waits for.
	cfg.QPS, cfg.Burst = 1000, 2000
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	s := &sim{t: t, cfg: cfg, root: root,
		nodes:  envInt("PAV_SCALE_NODES", 1000),
		pvcs:   envInt("PAV_SCALE_PVCS", 1000),
		logDir: filepath.Join(root, "_output", "scale"),
		rec:    newRecorder(),
	}
	if s.client, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if s.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(s.logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	s.out = newReport(s)

	// Ctrl-C or SIGTERM ends the run through the test's failure path, so that the
	// cleanups below still remove what it made.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, envDuration("PAV_SCALE_TIMEOUT", 90*time.Minute))
	defer cancel()

	s.checkInstalled(ctx)
	s.startKwok(ctx)
	// Registered after kwok's stop (cleanups run last-in first-out): kwok must still be
	// there to complete the deletion pods of any volume left behind.
	t.Cleanup(s.cleanup)
	s.cleanupLeftovers(ctx)

	defer s.out.print() // whatever was measured, also on failure

	s.createNodes(ctx)
	s.applyProvisioner(ctx)
	s.waitDaemonSetsSettled(ctx)
	s.storageClass(ctx)
	s.findProcs(ctx)
	s.idle(ctx)
	s.run(ctx)
}

// checkInstalled fails early, with what to do, when pav is not installed or kwok not built.
func (s *sim) checkInstalled(ctx context.Context) {
	s.t.Helper()
	if _, err := s.client.Discovery().ServerResourcesForGroupVersion("pav.albertofaria.github.io/v1alpha1"); err != nil {
		s.t.Fatalf("pav is not installed on the cluster (make deploy-e2e): %v", err)
	}
	if _, err := os.Stat(s.kwokBinary()); err != nil {
		s.t.Fatalf("no kwok binary (make tools builds _output/bin/kwok): %v", err)
	}
	if os.Geteuid() != 0 {
		s.t.Fatalf("run as root on the cluster's node: the processes' memory is read from /proc")
	}
}

func (s *sim) kwokBinary() string {
	if b := os.Getenv("PAV_KWOK"); b != "" {
		return b
	}
	return filepath.Join(s.root, "_output", "bin", "kwok")
}

func nproc() int {
	out, err := exec.Command("nproc").Output()
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	return n
}

func secs(d time.Duration) string { return fmt.Sprintf("%.1fs", d.Seconds()) }
