//go:build scale

package scale

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/pods-as-volumes/pav/test/podmetrics"
	"github.com/pods-as-volumes/pav/test/procstat"
)

// proc is a process on this node whose memory and CPU the run follows.
type proc struct {
	name string
	pid  int
	idle int64         // RSS before the claims
	peak procstat.Peak // RSS peak while creating and deleting them
}

// status reads a "kB" field of /proc/PID/status, in bytes.
func (p *proc) status(key string) int64 { return procstat.Status(p.pid, key) }

func (p *proc) rss() int64 { return p.status("VmRSS") }

// cpu is the process's user+system CPU time so far, in seconds.
func (p *proc) cpu() float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

// machineCPU returns the busy and total jiffies of all CPUs (/proc/stat).
func machineCPU() (busy, total float64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	for i, v := range f[1:] {
		x, _ := strconv.ParseFloat(v, 64)
		if i >= 8 { // guest, guest_nice are already in user, nice
			break
		}
		total += x
		if i != 3 && i != 4 { // idle, iowait
			busy += x
		}
	}
	return busy, total
}

// podProcs finds the processes of a pod's containers by the pod's UID in their cgroup
// (cgroupfs: …/pod<uid>/…; systemd: …pod<uid with _>.slice), named by name(cmdline);
// an empty name leaves the process out.
func podProcs(uid string, name func(cmdline []string) string) []*proc {
	var out []*proc
	alt := strings.ReplaceAll(uid, "-", "_")
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		cg, err := os.ReadFile(d + "/cgroup")
		if err != nil || !(strings.Contains(string(cg), "pod"+uid) || strings.Contains(string(cg), "pod"+alt)) {
			continue
		}
		cl, err := os.ReadFile(d + "/cmdline")
		if err != nil || len(cl) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cl), "\x00"), "\x00")
		n := name(args)
		if n == "" {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(d))
		out = append(out, &proc{name: n, pid: pid})
	}
	return out
}

// findProcs finds the processes the run measures: pav-sim's controller plugin and its
// external-provisioner, the manager, kwok, the control plane (their pid files) and this
// test itself.
func (s *sim) findProcs(ctx context.Context) {
	pods, err := s.client.CoreV1().Pods(pavNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
			continue
		}
		switch {
		case p.Name == "pav-"+provisionerName+"-controller-0":
			s.ctrlPod = p.DeepCopy()
			s.procs = append(s.procs, podProcs(string(p.UID), func(a []string) string {
				switch {
				case filepath.Base(a[0]) == "pav-driver":
					return "pav controller plugin (" + provisionerName + ")"
				case filepath.Base(a[0]) == "csi-provisioner":
					return "external-provisioner (" + provisionerName + ")"
				}
				return ""
			})...)
		case strings.HasPrefix(p.Name, "pav-manager-"):
			s.managerPod = p.DeepCopy()
			s.procs = append(s.procs, podProcs(string(p.UID), func(a []string) string {
				if filepath.Base(a[0]) == "pav" && len(a) > 1 && a[1] == "manager" {
					return "pav manager"
				}
				return ""
			})...)
		}
	}
	if s.ctrlPod == nil {
		s.t.Fatalf("no running pod pav-%s-controller-0 in %s", provisionerName, pavNS)
	}
	for _, c := range s.ctrlPod.Spec.Containers {
		s.out.setup = append(s.out.setup, []string{"controller container " + c.Name + ": image, args",
			"`" + c.Image + "` `" + strings.Join(c.Args, " ") + "`"})
	}
	if s.kwok != nil {
		s.procs = append(s.procs, &proc{name: "kwok", pid: s.kwok.Process.Pid})
	}
	clusterDir := os.Getenv("PAV_CLUSTER_DIR")
	if clusterDir == "" {
		clusterDir = filepath.Join(s.root, "_output", "cluster")
	}
	for _, d := range []string{"kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler"} {
		b, err := os.ReadFile(filepath.Join(clusterDir, "run", d+".pid"))
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid == 0 {
			s.t.Logf("no pid file for %s: its memory and CPU are not measured", d)
			continue
		}
		s.procs = append(s.procs, &proc{name: d, pid: pid})
	}
	s.kcmLog = filepath.Join(clusterDir, "logs", "kube-controller-manager.log")
	s.procs = append(s.procs, &proc{name: "this test (its client and informers)", pid: os.Getpid()})
	var names []string
	for _, p := range s.procs {
		names = append(names, fmt.Sprintf("%s=%d", p.name, p.pid))
	}
	s.t.Logf("measuring %s", strings.Join(names, ", "))
}

// sample records every process's peak RSS until stopped (stop may be called twice).
func (s *sim) sample() (stop func()) {
	return procstat.Every(250*time.Millisecond, func() {
		for _, p := range s.procs {
			p.peak.Observe(p.pid)
		}
	})
}

// A metrics sample: its labels and value.
type sample struct {
	labels map[string]string
	v      float64
}

// metricsText maps a metric name to its samples (Prometheus text format).
type metricsText map[string][]sample

var lineRE = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? ([^ ]+)`)
var labelRE = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

func parseMetrics(text string) metricsText {
	out := metricsText{}
	for _, line := range strings.Split(text, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		m := lineRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[4], 64)
		if err != nil {
			continue
		}
		labels := map[string]string{}
		for _, l := range labelRE.FindAllStringSubmatch(m[3], -1) {
			labels[l[1]] = l[2]
		}
		out[m[1]] = append(out[m[1]], sample{labels, v})
	}
	return out
}

// sum adds the samples of name whose labels pass keep (nil: all).
func (m metricsText) sum(name string, keep func(map[string]string) bool) float64 {
	t := 0.0
	for _, s := range m[name] {
		if keep == nil || keep(s.labels) {
			t += s.v
		}
	}
	return t
}

// by sums the samples of name by the value of one label.
func (m metricsText) by(name, label string, keep func(map[string]string) bool) map[string]float64 {
	out := map[string]float64{}
	for _, s := range m[name] {
		if keep == nil || keep(s.labels) {
			out[s.labels[label]] += s.v
		}
	}
	return out
}

// podMetrics reads a pod's /metrics (podmetrics.Scrape); nil, logged, when it cannot.
func (s *sim) podMetrics(ctx context.Context, p *corev1.Pod, port string) metricsText {
	if p == nil {
		return nil
	}
	text, err := podmetrics.Scrape(ctx, s.client, p, port)
	if err != nil {
		s.t.Logf("cannot read %s:%s/metrics: %v", p.Name, port, err)
		return nil
	}
	return parseMetrics(text)
}

// componentMetrics reads a control-plane component's secure /metrics on this node
// (controller-manager 10257, scheduler 10259) with the admin credentials.
func (s *sim) componentMetrics(port int) metricsText {
	c := rest.CopyConfig(s.cfg)
	c.Host = fmt.Sprintf("https://127.0.0.1:%d", port)
	c.TLSClientConfig.CAData, c.TLSClientConfig.CAFile, c.TLSClientConfig.ServerName = nil, "", ""
	c.TLSClientConfig.Insecure = true // their serving certificates are self-signed
	hc, err := rest.HTTPClientFor(c)
	if err != nil {
		return nil
	}
	hc.Timeout = 10 * time.Second
	resp, err := hc.Get(c.Host + "/metrics")
	if err != nil {
		s.t.Logf("cannot read %s/metrics: %v", c.Host, err)
		return nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		s.t.Logf("%s/metrics: %s", c.Host, resp.Status)
		return nil
	}
	return parseMetrics(string(b))
}

// snapshot is every counter the run compares, at one moment.
type snapshot struct {
	at                      time.Time
	cpu                     map[string]float64
	busy, total             float64
	apiserver, pav, sidecar metricsText
	manager, kcm, scheduler metricsText
}

func (s *sim) snapshot(ctx context.Context) *snapshot {
	sn := &snapshot{at: time.Now(), cpu: map[string]float64{}}
	sn.busy, sn.total = machineCPU()
	for _, p := range s.procs {
		sn.cpu[p.name] = p.cpu()
	}
	if b, err := s.client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx); err == nil {
		sn.apiserver = parseMetrics(string(b))
	} else {
		s.t.Logf("cannot read the API server's /metrics: %v", err)
	}
	sn.pav = s.podMetrics(ctx, s.ctrlPod, "8080")
	sn.sidecar = s.podMetrics(ctx, s.ctrlPod, "8081")
	sn.manager = s.podMetrics(ctx, s.managerPod, "8080")
	sn.kcm = s.componentMetrics(10257)
	sn.scheduler = s.componentMetrics(10259)
	return sn
}

// throttleRE matches client-go's log line about its own rate limiter.
var throttleRE = regexp.MustCompile(`Waited for ([0-9.]+)(m?s) due to client-side throttling`)

// throttling counts client-go's "Waited for … due to client-side throttling" lines in
// text and returns how many and the longest wait. client-go logs them at most once a
// second, for waits over 1 s, at --v=2 (pav and the sidecars run at 2) or every 10 s
// at --v=0.
func throttling(text string) (n int, longest time.Duration) {
	for _, m := range throttleRE.FindAllStringSubmatch(text, -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		d := time.Duration(v * float64(time.Second))
		if m[2] == "ms" {
			d = time.Duration(v * float64(time.Millisecond))
		}
		n++
		longest = max(longest, d)
	}
	return n, longest
}

// containerLog is a container's log since t.
func (s *sim) containerLog(ctx context.Context, p *corev1.Pod, container string, since time.Time) string {
	st := metav1.NewTime(since)
	b, err := s.client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: container, SinceTime: &st}).DoRaw(ctx)
	if err != nil {
		s.t.Logf("cannot read the log of %s/%s: %v", p.Name, container, err)
		return ""
	}
	return string(b)
}

// fileFrom is a file's content from offset on.
func fileFrom(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}
