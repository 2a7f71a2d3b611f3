package podrunner

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/report"
)

// ErrInvalidOperation wraps every error about an Operation (or its pod template)
// that pav refuses to run: retrying cannot help, so callers map it to
// INVALID_ARGUMENT.
var ErrInvalidOperation = errors.New("invalid pod operation")

// DefaultNamespace is where a pod goes when its template names no namespace
// and the Runner's Config.DefaultNamespace is empty. The driver sets
// Config.DefaultNamespace to its own namespace (--pod-namespace), which tenants
// cannot read or write: PaV's "default" was a namespace where anyone allowed to
// create pods could pre-create, watch or exec into pav's pods.
const DefaultNamespace = "pav"

// Operation is one phase for one volume. Its (Provisioner, Phase, VolumeKey) triple
// decides the pod's deterministic name: a retry of the same operation finds the same pod.
type Operation struct {
	Provisioner string
	Phase       v1alpha1.Phase
	// VolumeKey identifies the volume (and node) the operation is for, e.g. the CSI
	// volume name (create), handle (delete), NodeVolumeKey(handle, node) (stage).
	VolumeKey string
	// Template is the evaluated pod template. Only metadata.namespace, .labels and
	// .annotations are used from its metadata: the name is pav's (deterministic),
	// and finalizers or owner references would get in the way of cleanup.
	Template corev1.PodTemplateSpec
	// NodeName pins staging/unstaging pods to their node (spec.nodeName) and sets LabelNode.
	NodeName string
	// HostPath is the host directory mounted at /pav (hostPath, DirectoryOrCreate)
	// for staging/unstaging; empty means an emptyDir.
	HostPath string
	// KeepRunning: the pod may create /pav/ready and keep running (staging).
	KeepRunning bool
	// Owner, if set, becomes the pod's owner reference (neither its
	// controller nor blocking the owner's deletion): the garbage collector
	// deletes the pod when the owner goes. It must live in the pod's
	// namespace (BuildPod refuses it otherwise). The template's own owner
	// references are never used.
	Owner *metav1.OwnerReference
	// OwnerNamespace is the namespace of Owner.
	OwnerNamespace string
	// EndAtExit (node pods): the caller discards the pod (Discard) once Run
	// returns, rather than waiting for it to go. Its command is then wrapped
	// (ReportExec) and its end taken from the exit code pav-report writes in
	// /pav, before the kubelet publishes it: deleting a pod whose end is not
	// published yet costs the kubelet a graceful deletion's round trip, which
	// a caller that waits for the pod to go would wait for.
	EndAtExit bool
	// LogFiles are /pav files too large for a report (report.LogFiles:
	// blocks), which pav-report prints to the reporting container's log once
	// the command has ended; Run reads them from there into Result.Files
	// (report.ReadLogFile). Controller-side pods only.
	LogFiles []string

	// Token is the pod's proof of origin: a fresh random value (NewToken) that
	// the caller recorded where only pav can write BEFORE calling Run. The pod
	// carries it in AnnotationToken, and a pod of the operation's name is
	// adopted only if it carries this token (or has UID). Run requires it.
	Token string
	// UID is the UID of the operation's pod as the caller recorded it (after
	// Created). Once set, only the pod with this UID is adopted, whatever its
	// token: a token is readable by whoever can read the pod, a UID cannot be
	// chosen by its creator. With UID set Run never creates a pod: the recorded
	// pod being gone means its outcome is lost (ErrPodDeleted).
	UID types.UID
	// Created, if set, is called once the operation's pod exists and carries
	// Token (pav created it, or adopted it by token), with its UID, so that the
	// caller records the UID at once. Its error fails Run and leaves the pod
	// for the retry, which adopts it by token.
	Created func(ctx context.Context, uid types.UID) error
}

// Namespace is where the operation's pod lives: the template's
// metadata.namespace, else defaultNamespace, else DefaultNamespace.
func (op *Operation) Namespace(defaultNamespace string) string {
	switch {
	case op.Template.Namespace != "":
		return op.Template.Namespace
	case defaultNamespace != "":
		return defaultNamespace
	}
	return DefaultNamespace
}

// PodName is the operation's deterministic pod name.
func (op *Operation) PodName() string {
	return PodName(op.Provisioner, op.Phase, op.VolumeKey)
}

// NewToken returns a fresh Operation.Token: 128 random bits in hex.
func NewToken() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		// crypto/rand.Read does not fail on Linux (getrandom); if it ever
		// did, a predictable token would be worse than no pod.
		panic(fmt.Sprintf("podrunner: no randomness for a pod token: %v", err))
	}
	return hex.EncodeToString(b[:])
}

// validateIdentity checks what Run and Delete need to tell the operation's pod
// from a pod someone else created under its name.
func (op *Operation) validateIdentity(run bool) error {
	switch {
	case run && op.Token == "":
		return fmt.Errorf("%w: no token: record podrunner.NewToken() for the operation before running its pod", ErrInvalidOperation)
	case !run && op.Token == "" && op.UID == "":
		return fmt.Errorf("%w: neither the token nor the UID of the pod to delete is known", ErrInvalidOperation)
	case len(op.Token) > maxTokenLen:
		return fmt.Errorf("%w: token of %d bytes (at most %d)", ErrInvalidOperation, len(op.Token), maxTokenLen)
	}
	return nil
}

func (op *Operation) validate() error {
	switch {
	case op.Provisioner == "":
		return fmt.Errorf("%w: no provisioner", ErrInvalidOperation)
	case op.Phase == "":
		return fmt.Errorf("%w: no phase", ErrInvalidOperation)
	case op.VolumeKey == "":
		return fmt.Errorf("%w: no volume key", ErrInvalidOperation)
	case op.HostPath != "" && op.NodeName == "":
		// A hostPath directory is only meaningful on a known node.
		return fmt.Errorf("%w: host path %q without a node", ErrInvalidOperation, op.HostPath)
	case op.HostPath != "" && !path.IsAbs(op.HostPath):
		return fmt.Errorf("%w: host path %q is not absolute", ErrInvalidOperation, op.HostPath)
	case op.HostPath != "" && len(op.LogFiles) > 0:
		return fmt.Errorf("%w: a node pod's /pav is read on the host; log files are for controller-side pods", ErrInvalidOperation)
	}
	return nil
}

// ReportMode says how the /pav files of a controller-side pod reach the
// driver (see the package documentation).
type ReportMode string

const (
	// ReportSidecar: every controller-side pod gets the report sidecar.
	ReportSidecar ReportMode = "sidecar"
	// ReportExec: a pod with one container whose command the template states
	// has pav-report run that command (an image volume brings it in); the
	// others get the sidecar. It needs image volumes (Kubernetes 1.35+, or the
	// ImageVolume feature gate, and containerd 2.1+ or CRI-O 1.31+).
	ReportExec ReportMode = "exec"
)

// PodConfig is what BuildPod needs beside the operation.
type PodConfig struct {
	// ReportImage is the image holding pav-report (the pav image).
	ReportImage string
	// DefaultNamespace is where the pod goes if its template names no
	// namespace (see Operation.Namespace).
	DefaultNamespace string
	// Report is how a controller-side pod reports; "" = ReportSidecar.
	Report ReportMode
}

// BuildPod builds the pod an operation runs (see the package documentation and
// pav-spec.md §4). It does not talk to the API server; the driver can use it to
// check a template early. An empty op.Token leaves out AnnotationToken
// (`pav render` shows pods without one; Run never submits one).
func BuildPod(op Operation, cfg PodConfig) (*corev1.Pod, error) {
	reportImage, defaultNamespace := cfg.ReportImage, cfg.DefaultNamespace
	if err := op.validate(); err != nil {
		return nil, err
	}
	if reportImage == "" {
		return nil, fmt.Errorf("%w: no report image configured", ErrInvalidOperation)
	}
	tmpl := op.Template.DeepCopy()
	spec := tmpl.Spec

	// The injected volume and mounts must not clash with the user's.
	for _, v := range spec.Volumes {
		if v.Name == VolumeName {
			return nil, fmt.Errorf("%w: the pod template declares a volume named %q, which pav reserves for the %s directory",
				ErrInvalidOperation, VolumeName, MountPath)
		}
	}
	var clash error
	forEachContainer(&spec, func(kind string, c *corev1.Container) {
		if c.Name == ReportContainer && clash == nil {
			clash = fmt.Errorf("%w: the pod template declares a container named %q, which pav reserves for its report sidecar",
				ErrInvalidOperation, ReportContainer)
		}
		for _, m := range c.VolumeMounts {
			if path.Clean(m.MountPath) == MountPath && clash == nil {
				clash = fmt.Errorf("%w: %s %q mounts volume %q at %s, which pav reserves for its own volume",
					ErrInvalidOperation, kind, c.Name, m.Name, MountPath)
			}
		}
		for _, d := range c.VolumeDevices {
			if path.Clean(d.DevicePath) == MountPath && clash == nil {
				clash = fmt.Errorf("%w: %s %q puts device %q at %s, which pav reserves for its own volume",
					ErrInvalidOperation, kind, c.Name, d.Name, MountPath)
			}
		}
	})
	if clash != nil {
		return nil, clash
	}
	if op.Owner != nil && op.OwnerNamespace != op.Namespace(defaultNamespace) {
		return nil, fmt.Errorf("%w: the pod's owner %s %s is in namespace %q, the pod in %q: an owner must be in its dependent's namespace",
			ErrInvalidOperation, op.Owner.Kind, op.Owner.Name, op.OwnerNamespace, op.Namespace(defaultNamespace))
	}
	if op.NodeName != "" && spec.NodeName != "" && spec.NodeName != op.NodeName {
		return nil, fmt.Errorf("%w: the pod template pins the pod to node %q but the operation runs on node %q",
			ErrInvalidOperation, spec.NodeName, op.NodeName)
	}

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			// Template name/generateName are ignored on purpose: the name must be
			// deterministic so that a retry finds the same pod.
			Name:        op.PodName(),
			Namespace:   op.Namespace(defaultNamespace),
			Labels:      map[string]string{},
			Annotations: map[string]string{},
		},
		Spec: spec,
	}
	for k, v := range tmpl.Labels {
		pod.Labels[k] = v
	}
	for k, v := range tmpl.Annotations {
		pod.Annotations[k] = v
	}
	// Ours win: the informer selects on them and adoption checks them.
	pod.Labels[LabelProvisioner] = op.Provisioner
	pod.Labels[LabelPhase] = string(op.Phase)
	pod.Labels[LabelVolume] = VolumeLabel(op.VolumeKey)
	if op.NodeName != "" {
		pod.Labels[LabelNode] = NodeLabel(op.NodeName)
		pod.Spec.NodeName = op.NodeName
	}
	pod.Annotations[AnnotationVolumeKey] = op.VolumeKey
	if op.Owner != nil {
		pod.OwnerReferences = []metav1.OwnerReference{*op.Owner}
	}
	delete(pod.Annotations, AnnotationToken) // a template must not choose it
	if op.Token != "" {
		pod.Annotations[AnnotationToken] = op.Token
	}

	// Never restart, KeepRunning staging pods included: a staging pod whose
	// container crashed has lost (or left half-made) the mount at /pav/volume that
	// client pods are using, and staging scripts need not be idempotent. A silent
	// restart would hide that; a Failed pod surfaces it to the node plugin.
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever

	vol := corev1.Volume{Name: VolumeName}
	if op.HostPath != "" {
		t := corev1.HostPathDirectoryOrCreate
		vol.HostPath = &corev1.HostPathVolumeSource{Path: op.HostPath, Type: &t}
	} else {
		vol.EmptyDir = &corev1.EmptyDirVolumeSource{}
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes, vol)

	forEachContainer(&pod.Spec, func(_ string, c *corev1.Container) {
		c.VolumeMounts = append(c.VolumeMounts, pavMount(op.HostPath != "", isPrivileged(c), false))
	})

	// Node pods' /pav is the node plugin's own directory, which it reads
	// itself (hostdir.go): wrapped, they only tell when their command ended;
	// the others need pav-report to carry /pav out.
	switch {
	case op.HostPath != "":
		if cfg.Report == ReportExec && op.EndAtExit && wrappable(&op, &pod.Spec) {
			wrap(&pod.Spec, reportImage, true, nil)
		}
	case cfg.Report == ReportExec && wrappable(&op, &pod.Spec):
		wrap(&pod.Spec, reportImage, false, op.LogFiles)
	default:
		pod.Spec.InitContainers = append([]corev1.Container{reportSidecar(op, reportImage, reportBudget(&pod.Spec, 1))},
			pod.Spec.InitContainers...)
	}
	return pod, nil
}

// logFileArgs are pav-report's flags for op's log files.
func logFileArgs(files []string) []string {
	var out []string
	for _, f := range files {
		out = append(out, "--log-file="+f)
	}
	return out
}

// wrappable: pav-report can run the pod's command and report when it ends.
// That takes one container, the only one writing /pav when it ends (no
// sidecar of the user's), whose command pav knows (not the image's
// entrypoint, which only the node sees), and no name or path of
// ReportVolume's in use. Controller-side KeepRunning pods keep the sidecar,
// whose readiness probe tells /pav/ready (a node pod's is read on the host).
func wrappable(op *Operation, spec *corev1.PodSpec) bool {
	if (op.KeepRunning && op.HostPath == "") || len(spec.Containers) != 1 || len(spec.Containers[0].Command) == 0 {
		return false
	}
	for _, c := range spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			return false
		}
	}
	for _, v := range spec.Volumes {
		if v.Name == ReportVolume {
			return false
		}
	}
	for _, m := range spec.Containers[0].VolumeMounts {
		if p := path.Clean(m.MountPath); p == ReportDir || strings.HasPrefix(p, ReportDir+"/") {
			return false
		}
	}
	return true
}

// wrap makes pav-report, from the report image mounted as an image volume,
// the first process of the pod's one container: it runs the template's
// command (with its args) as its child and, when it ends, writes the report
// as the container's termination message (report.Exec), or for a node pod
// the command's exit code to /pav/.pav-exit (report.ExecNode).
func wrap(spec *corev1.PodSpec, image string, node bool, logFiles []string) {
	c := &spec.Containers[0]
	if node {
		c.Command = append([]string{ReportExecPath, "--exec", "--dir=" + MountPath,
			"--exit-file=" + path.Join(MountPath, report.FileExit), "--"}, c.Command...)
	} else {
		args := append([]string{ReportExecPath, "--exec", "--dir=" + MountPath,
			"--max-bytes=" + strconv.Itoa(reportBudget(spec, 0))}, logFileArgs(logFiles)...)
		if len(logFiles) == 0 {
			// A success can be relayed by the node plugin (EndedFile);
			// not one whose files the driver must read from the log.
			args = append(args, endedFileFlag)
		}
		c.Command = append(append(args, "--"), c.Command...)
		c.TerminationMessagePath = report.TerminationLog
		c.TerminationMessagePolicy = corev1.TerminationMessageReadFile
	}
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: ReportVolume, MountPath: ReportDir, ReadOnly: true})
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: ReportVolume, VolumeSource: corev1.VolumeSource{
		Image: &corev1.ImageVolumeSource{Reference: image, PullPolicy: corev1.PullIfNotPresent}}})
}

// endedFileFlag makes a wrapped controller-side pod's pav-report copy its
// report to /pav/.pav-ended on success (report.ExecEnded).
var endedFileFlag = "--ended-file=" + path.Join(MountPath, report.FileEnded)

// EndedFile says whether pod is a controller-side pod whose pav-report copies
// its report, on success, to /pav/.pav-ended in an emptyDir: the volume's
// name in the pod and the wrapped container's. The node plugin of the pod's
// node relays that copy (internal/endrelay).
func EndedFile(pod *corev1.Pod) (volume, container string, ok bool) {
	name, wrapped := Wrapped(pod)
	if !wrapped {
		return "", "", false
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == name && !slices.Contains(c.Command, endedFileFlag) {
			return "", "", false
		}
	}
	for _, v := range pod.Spec.Volumes {
		if v.Name == VolumeName && v.EmptyDir != nil {
			return v.Name, name, true
		}
	}
	return "", "", false
}

// Wrapped is the name of the container pav-report wraps in pod (ReportExec),
// if any: the pod's spec says how it reports (a pod adopted from an earlier
// driver may have been built in the other mode).
func Wrapped(pod *corev1.Pod) (string, bool) {
	for _, c := range pod.Spec.Containers {
		if len(c.Command) > 1 && c.Command[0] == ReportExecPath && c.Command[1] == "--exec" {
			return c.Name, true
		}
	}
	return "", false
}

// pavMount is the /pav mount of one container. With a hostPath, a privileged
// container gets Bidirectional propagation so that a mount it makes at
// /pav/volume reaches the host (and the node plugin, which bind-mounts it into
// client pods); the API only allows Bidirectional for privileged containers, so
// the others get HostToContainer, which still lets them see (and, crucially,
// release) mounts made by their siblings.
func pavMount(hostPath, privileged, readOnly bool) corev1.VolumeMount {
	m := corev1.VolumeMount{Name: VolumeName, MountPath: MountPath, ReadOnly: readOnly}
	if hostPath {
		p := corev1.MountPropagationHostToContainer
		if privileged {
			p = corev1.MountPropagationBidirectional
		}
		m.MountPropagation = &p
	}
	return m
}

func isPrivileged(c *corev1.Container) bool {
	return c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged
}

func forEachContainer(spec *corev1.PodSpec, f func(kind string, c *corev1.Container)) {
	for i := range spec.InitContainers {
		f("init container", &spec.InitContainers[i])
	}
	for i := range spec.Containers {
		f("container", &spec.Containers[i])
	}
}

// reportBudget is how many bytes the report sidecar's termination message may
// take. The kubelet keeps the last 4096 bytes of a termination-log file, and
// then cuts every message of the pod to 12 KiB divided by its number of
// containers (keeping the head): a JSON report cut by either is unreadable, so
// the sidecar must fit itself in the smaller of the two. spec holds the
// user's containers; extra counts those pav adds (the sidecar).
func reportBudget(spec *corev1.PodSpec, extra int) int {
	n := len(spec.Containers) + len(spec.InitContainers) + len(spec.EphemeralContainers) + extra
	b := maxPodTerminationMessages / n
	if b > report.MaxMessage {
		b = report.MaxMessage
	}
	return b
}

// maxPodTerminationMessages is the kubelet's limit for all the termination
// messages of a pod together.
const maxPodTerminationMessages = 12 * 1024

// ReportCommand is the report sidecar's program (cmd/pav-report), in the pav
// image beside pav itself: a binary of its own that links only the standard
// library, because every controller-side pod starts one, and pav's binary
// spends some 60 ms and 30 MB of RSS initialising client-go, metrics and
// templating before main. (`pav report` still runs it, for pods that an
// older pav made.)
const ReportCommand = "pav-report"

// reportSidecar is the native sidecar (an init container with restartPolicy
// Always) that reports the /pav files. Being first among the init containers,
// it starts before every user container (init ones included) and the kubelet
// stops it only after all of them have exited: it is then sent SIGTERM, writes
// the files into its termination message, and the API carries them to the
// controller plugin, which has no access to the node the pod ran on.
//
// For KeepRunning pods its readiness probe turns "/pav/ready exists" into a
// container-ready watch event, so nobody polls.
func reportSidecar(op Operation, image string, budget int) corev1.Container {
	always := corev1.ContainerRestartPolicyAlways
	no := false
	c := corev1.Container{
		Name:          ReportContainer,
		Image:         image,
		Command:       append([]string{ReportCommand, "--dir=" + MountPath}, logFileArgs(op.LogFiles)...),
		RestartPolicy: &always,
		Env: []corev1.EnvVar{
			{Name: report.MaxBytesEnv, Value: strconv.Itoa(budget)},
		},
		VolumeMounts: []corev1.VolumeMount{pavMount(op.HostPath != "", false, true)},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{
				corev1.ResourceCPU:    resource.MustParse("5m"),
				corev1.ResourceMemory: resource.MustParse("16Mi"),
			},
			Limits: corev1.ResourceList{
				corev1.ResourceMemory: resource.MustParse("64Mi"),
			},
		},
		TerminationMessagePath:   report.TerminationLog,
		TerminationMessagePolicy: corev1.TerminationMessageReadFile,
		ImagePullPolicy:          corev1.PullIfNotPresent,
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: &no,
			ReadOnlyRootFilesystem:   boolPtr(true),
		},
	}
	if op.KeepRunning {
		c.ReadinessProbe = &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{
				Command: []string{ReportCommand, "--dir=" + MountPath, "--check-ready"},
			}},
			PeriodSeconds:    1,
			TimeoutSeconds:   1,
			SuccessThreshold: 1,
			FailureThreshold: 1,
		}
	}
	return c
}

func boolPtr(b bool) *bool { return &b }
