package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/controllerserver"
	"github.com/pods-as-volumes/pav/internal/driver"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/internal/provisioner"
	"github.com/pods-as-volumes/pav/internal/templating"
	"github.com/pods-as-volumes/pav/internal/volume"
	"github.com/pods-as-volumes/pav/nodeserver"
	"github.com/pods-as-volumes/pav/podrunner"
)

// renderInputs are `pav render`'s flags.
type renderInputs struct {
	file, phase, pvc, sc, pv, node, handle, capacity, reportImage, stateDir, podNamespace, podReport string
	// inlinePod and inlineVolume: an inline ephemeral volume (a pod's csi
	// volume) instead of a claim or a PV.
	inlinePod, inlineVolume string
	params                  paramFlag
	readOnly                bool
}

type paramFlag map[string]string

func (p paramFlag) String() string { return fmt.Sprint(map[string]string(p)) }
func (p paramFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want key=value, got %q", s)
	}
	p[k] = v
	return nil
}

// rendered is what `pav render` prints: the typed result of the phase and the
// pod exactly as pav would submit it (report sidecar and /pav volume included).
type rendered struct {
	Phase      v1alpha1.Phase      `json:"phase"`
	Validation *renderedValidation `json:"validation,omitempty"`
	Creation   *renderedCreation   `json:"creation,omitempty"`
	Capacity   *renderedCapacity   `json:"capacity,omitempty"`
	Pod        *corev1.Pod         `json:"pod,omitempty"`
	Note       string              `json:"note,omitempty"`
}

type renderedValidation struct {
	VolumeModes []corev1.PersistentVolumeMode       `json:"volumeModes"`
	AccessModes []corev1.PersistentVolumeAccessMode `json:"accessModes"`
	MinCapacity int64                               `json:"minCapacity"`
	MaxCapacity *int64                              `json:"maxCapacity"`
	Result      string                              `json:"result"`
}

type renderedCreation struct {
	Handle   string `json:"handle,omitempty"`
	Capacity *int64 `json:"capacity,omitempty"`
	// AccessibleTopology is where the volume is reachable from unless the
	// creation pod writes /pav/topology.
	AccessibleTopology []map[string]string `json:"accessibleTopology,omitempty"`
}

// renderedCapacity is the segment a capacity pod measures (pav pins the pod
// to it) and how often it runs while asked for.
type renderedCapacity struct {
	Segment         map[string]string `json:"segment"`
	RefreshInterval string            `json:"refreshInterval"`
}

func runRender(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	in := renderInputs{params: paramFlag{}}
	fs := flag.NewFlagSet("pav render", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&in.file, "f", "", "the PavProvisioner (YAML or JSON; - for stdin)")
	fs.StringVar(&in.phase, "phase", "", "validation, creation, deletion, staging, unstaging or capacity")
	fs.StringVar(&in.pvc, "pvc", "", "PersistentVolumeClaim YAML (dynamic phases; staging when bound)")
	fs.StringVar(&in.sc, "sc", "", "StorageClass YAML (dynamic phases and capacity; default: parameters from --param only)")
	fs.StringVar(&in.pv, "pv", "", "PersistentVolume YAML (static validation, deletion, staging, unstaging)")
	fs.StringVar(&in.node, "node", "", "Node YAML (staging, unstaging; dynamic phases with spec.topology: the node WaitForFirstConsumer selected; capacity with spec.topology: the node whose segment is measured)")
	fs.StringVar(&in.handle, "handle", "", "volume handle (deletion; default: the PV's or pvc-<uid>)")
	fs.StringVar(&in.capacity, "capacity", "", "volume capacity (deletion, staging; default: the PV's)")
	fs.BoolVar(&in.readOnly, "read-only", false, "staging: stage read-only")
	fs.StringVar(&in.reportImage, "report-image", "ghcr.io/pods-as-volumes/pav:latest", "image of pav-report (the pav image) in the printed pod")
	fs.StringVar(&in.podReport, "pod-report", string(podrunner.ReportExec), "how the printed pod reports: exec (pav-report wraps the command of a pod with one container; the driver's choice on Kubernetes 1.35+, and node plugins' always) or sidecar")
	fs.StringVar(&in.stateDir, "state-dir", "", "staging, unstaging: the node plugin's --state-dir (default /var/lib/kubelet/plugins/NAME/volumes)")
	fs.StringVar(&in.podNamespace, "pod-namespace", podrunner.DefaultNamespace, "the driver's --pod-namespace: where pods whose template names no namespace go")
	fs.Var(in.params, "param", "a parameter key=value (StorageClass parameters or PV volumeAttributes); repeatable, wins over --sc/--pv")
	fs.StringVar(&in.inlinePod, "inline-pod", "", "Pod YAML with an inline ephemeral volume (a csi volume of the provisioner's driver): render that volume's phases (with its UID, or a made-up one)")
	fs.StringVar(&in.inlineVolume, "volume", "", "with --inline-pod: the name of its csi volume (default: its first of the provisioner's driver)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if m := podrunner.ReportMode(in.podReport); m != podrunner.ReportExec && m != podrunner.ReportSidecar {
		fmt.Fprintf(stderr, "pav render: --pod-report must be exec or sidecar, got %q\n", in.podReport)
		return 2
	}
	out, err := render(ctx, in, stdin)
	if err != nil {
		fmt.Fprintf(stderr, "pav render: %v\n", err)
		return 1
	}
	b, err := yaml.Marshal(out)
	if err != nil {
		fmt.Fprintf(stderr, "pav render: %v\n", err)
		return 1
	}
	_, _ = stdout.Write(b)
	return 0
}

func render(ctx context.Context, in renderInputs, stdin io.Reader) (*rendered, error) {
	if in.file == "" {
		return nil, fmt.Errorf("-f provisioner.yaml is required")
	}
	data, err := readInput(in.file, stdin)
	if err != nil {
		return nil, err
	}
	p, err := provisioner.Load(data)
	if err != nil {
		return nil, err
	}
	if err := phase.Check(p); err != nil {
		return nil, err
	}
	var objs phase.Objects
	for _, f := range []struct {
		flag, path string
		into       runtime.Object
		set        func()
	}{
		{"--pvc", in.pvc, &corev1.PersistentVolumeClaim{}, nil},
		{"--sc", in.sc, &storagev1.StorageClass{}, nil},
		{"--pv", in.pv, &corev1.PersistentVolume{}, nil},
		{"--node", in.node, &corev1.Node{}, nil},
	} {
		if f.path == "" {
			continue
		}
		b, err := os.ReadFile(f.path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.flag, err)
		}
		if err := yaml.UnmarshalStrict(b, f.into); err != nil {
			return nil, fmt.Errorf("%s %s: %w", f.flag, f.path, err)
		}
		switch o := f.into.(type) {
		case *corev1.PersistentVolumeClaim:
			objs.PVC = o
		case *storagev1.StorageClass:
			objs.SC = o
		case *corev1.PersistentVolume:
			objs.PV = o
		case *corev1.Node:
			objs.Node = o
		}
	}
	eval := phase.NewEvaluator(offlinePVCs{objs.PVC})
	ph := v1alpha1.Phase(in.phase)
	out := &rendered{Phase: ph}
	if in.inlinePod != "" {
		return renderInline(ctx, in, p, objs.Node, eval, out)
	}
	// Pods are built by the driver's own code: the controller plugin's
	// (controllerserver.PodOperation) for the dynamic phases, the node plugin's
	// (nodeserver.PodOperation, on --node, with the driver's state directory)
	// for staging, unstaging and static validation.
	stateDir := in.stateDir
	if stateDir == "" {
		stateDir = driver.DefaultStateDir(p.Name)
	}
	controllerOp := func(key string) operationOf {
		return func(t corev1.PodTemplateSpec) podrunner.Operation {
			return controllerserver.PodOperation(p.Name, ph, key, t)
		}
	}
	nodeOp := func(node, handle string) operationOf {
		return func(t corev1.PodTemplateSpec) podrunner.Operation {
			return nodeserver.PodOperation(node, stateDir, p.Name, ph, handle, t)
		}
	}
	need := func(what string, ok bool) error {
		if !ok {
			return fmt.Errorf("the %s phase needs %s", ph, what)
		}
		return nil
	}
	switch ph {
	case v1alpha1.PhaseValidation:
		var r phase.Request
		var vars templating.Vars
		var op operationOf
		switch {
		case objs.PVC != nil:
			// Dynamic: the controller plugin, keyed by the CSI volume name.
			r = claimRequest(objs.PVC, objs.SC, in.params)
			if r.Topology, err = selectedTopology(p, objs.Node); err != nil {
				return nil, err
			}
			vars, err = phase.ValidationVars(r, phase.Objects{PVC: objs.PVC, SC: objs.SC}, "")
			op = controllerOp(controllerserver.DefaultHandle(objs.PVC))
		case objs.PV != nil:
			// Static: the node plugin, before the first staging on a node.
			var handle string
			r, handle = pvRequest(objs.PV, in.params)
			vars, err = phase.ValidationVars(r, phase.Objects{PV: objs.PV, PVC: objs.PVC}, handle)
			if objs.Node != nil {
				op = nodeOp(objs.Node.Name, handle)
			}
		default:
			return nil, need("--pvc (dynamic provisioning) or --pv (static provisioning)", false)
		}
		if err != nil {
			return nil, err
		}
		cfg, err := eval.Validation(ctx, p, vars)
		if err != nil {
			return nil, err
		}
		v := &renderedValidation{VolumeModes: cfg.VolumeModes, AccessModes: cfg.AccessModes, MinCapacity: cfg.MinCapacity, MaxCapacity: cfg.MaxCapacity, Result: "the request passes spec.volumeValidation"}
		if err := cfg.CheckRequest(r); err != nil {
			v.Result = "REJECTED: " + err.Error()
		}
		out.Validation = v
		if op == nil && cfg.PodTemplate != nil {
			out.Note = "static validation runs on the node that stages the volume first: give --node to see its pod"
			return out, nil
		}
		return out, setPod(out, ph, cfg.PodTemplate, in, op)
	case v1alpha1.PhaseCreation, v1alpha1.PhaseDeletion:
		if err := need("--pvc", objs.PVC != nil); err != nil {
			return nil, err
		}
		r := claimRequest(objs.PVC, objs.SC, in.params)
		if r.Topology, err = selectedTopology(p, objs.Node); err != nil {
			return nil, err
		}
		defHandle := controllerserver.DefaultHandle(objs.PVC)
		o := phase.Objects{PVC: objs.PVC, SC: objs.SC}
		if ph == v1alpha1.PhaseCreation {
			vars, err := phase.CreationVars(r, o, defHandle)
			if err != nil {
				return nil, err
			}
			cfg, err := eval.Creation(ctx, p, vars)
			if err != nil {
				return nil, err
			}
			f, _ := phase.FeaturesOf(&p.Spec) // checked above
			topology, _ := phase.AccessibleTopology(nil, cfg.AccessibleTopology, f.TopologyKeys, r.Topology)
			out.Creation = &renderedCreation{Handle: cfg.Handle, Capacity: cfg.Capacity, AccessibleTopology: topology}
			// external-provisioner names the volume as PaV names its default handle.
			return out, setPod(out, ph, cfg.PodTemplate, in, controllerOp(defHandle))
		}
		handle, capacity := in.handle, int64(0)
		if objs.PV != nil && objs.PV.Spec.CSI != nil {
			if handle == "" {
				handle = objs.PV.Spec.CSI.VolumeHandle
			}
			if q, ok := objs.PV.Spec.Capacity[corev1.ResourceStorage]; ok {
				capacity = q.Value()
			}
		}
		if handle == "" {
			handle = defHandle
		}
		if in.capacity != "" {
			if capacity, err = phase.ParseCapacity(in.capacity, phase.Floor); err != nil {
				return nil, fmt.Errorf("--capacity: %w", err)
			}
		}
		vars, err := phase.DeletionVars(r, o, defHandle, handle, capacity)
		if err != nil {
			return nil, err
		}
		cfg, err := eval.Deletion(ctx, p, vars)
		if err != nil {
			return nil, err
		}
		return out, setPod(out, ph, cfg.PodTemplate, in, controllerOp(controllerserver.DeletionKey(handle)))
	case v1alpha1.PhaseStaging, v1alpha1.PhaseUnstaging:
		if err := need("--pv (the PersistentVolume being staged)", objs.PV != nil && objs.PV.Spec.CSI != nil); err != nil {
			return nil, err
		}
		if err := need("--node", objs.Node != nil); err != nil {
			return nil, err
		}
		st := stagedFrom(objs.PV, objs.PVC, in)
		if in.capacity != "" {
			if st.Capacity, err = phase.ParseCapacity(in.capacity, phase.Floor); err != nil {
				return nil, fmt.Errorf("--capacity: %w", err)
			}
		}
		vars, err := phase.StagingVars(st, objs)
		if err != nil {
			return nil, err
		}
		var cfg *phase.PodConfig
		if ph == v1alpha1.PhaseStaging {
			cfg, err = eval.Staging(ctx, p, vars)
		} else {
			cfg, err = eval.Unstaging(ctx, p, vars)
		}
		if err != nil {
			return nil, err
		}
		return out, setPod(out, ph, cfg.PodTemplate, in, nodeOp(objs.Node.Name, st.Handle))
	case v1alpha1.PhaseCapacity:
		f, _ := phase.FeaturesOf(&p.Spec) // checked above
		if !f.Capacity {
			return nil, fmt.Errorf("the capacity phase needs spec.storageCapacity")
		}
		segment := map[string]string{}
		if len(f.TopologyKeys) > 0 {
			// What external-provisioner asks for: a node's segment.
			if err := need("--node (the node whose topology segment is measured)", objs.Node != nil); err != nil {
				return nil, err
			}
			if segment, err = phase.NodeSegment(objs.Node.Name, objs.Node.Labels, f.TopologyKeys); err != nil {
				return nil, fmt.Errorf("--node: %w", err)
			}
		}
		params := map[string]string{}
		if objs.SC != nil {
			maps.Copy(params, objs.SC.Parameters)
		}
		maps.Copy(params, in.params)
		op, cfg, err := controllerserver.CapacityOperation(ctx, eval, p, segment, params)
		if err != nil {
			return nil, err
		}
		out.Capacity = &renderedCapacity{Segment: segment, RefreshInterval: cfg.RefreshInterval.String()}
		// The operation is the driver's own: pinned to the segment, keyed by the pod.
		return out, setPod(out, ph, &op.Template, in, func(corev1.PodTemplateSpec) podrunner.Operation { return op })
	}
	return nil, fmt.Errorf("--phase must be validation, creation, deletion, staging, unstaging or capacity, got %q", in.phase)
}

// selectedTopology is what external-provisioner asks for (accessibility
// requirements) once the scheduler picked node for a WaitForFirstConsumer
// claim: that node's segment of spec.topology.nodeLabels. nil without
// spec.topology or --node.
func selectedTopology(p *v1alpha1.PavProvisioner, node *corev1.Node) (*v1alpha1.TopologyRequirement, error) {
	f, err := phase.FeaturesOf(&p.Spec)
	if err != nil || node == nil || len(f.TopologyKeys) == 0 {
		return nil, err
	}
	seg, err := phase.NodeSegment(node.Name, node.Labels, f.TopologyKeys)
	if err != nil {
		return nil, fmt.Errorf("--node: %w", err)
	}
	return &v1alpha1.TopologyRequirement{Requisite: []map[string]string{seg}, Preferred: []map[string]string{seg}}, nil
}

// renderedToken stands for the random token the driver records, and puts on
// the pod, before it creates it.
const renderedToken = "<random: recorded by pav before it creates the pod>"

// operationOf is the driver's operation for an evaluated pod template.
type operationOf func(t corev1.PodTemplateSpec) podrunner.Operation

// setPod builds the pod as the driver's pod runner would (podrunner.BuildPod of
// the driver's own operation), or notes that the phase has none.
func setPod(out *rendered, ph v1alpha1.Phase, t *corev1.PodTemplateSpec, in renderInputs, op operationOf) error {
	if t == nil {
		out.Note = fmt.Sprintf("spec.%s has no podTemplate: no pod runs in this phase", ph.Field())
		return nil
	}
	o := op(*t)
	o.Token = renderedToken
	pod, err := podrunner.BuildPod(o, podrunner.PodConfig{ReportImage: in.reportImage, DefaultNamespace: in.podNamespace,
		Report: podrunner.ReportMode(in.podReport)})
	if err != nil {
		return err
	}
	pod.APIVersion, pod.Kind = "v1", "Pod"
	out.Pod = pod
	return nil
}

// claimRequest is what a PVC asks for, read as the controller plugin reads it
// (phase.FromClaim), with the StorageClass parameters and --param on top.
func claimRequest(pvc *corev1.PersistentVolumeClaim, sc *storagev1.StorageClass, params map[string]string) phase.Request {
	r := phase.FromClaim(phase.Request{VolumeMode: corev1.PersistentVolumeFilesystem, Params: map[string]string{}}, pvc)
	if sc != nil {
		for k, v := range sc.Parameters {
			r.Params[k] = v
		}
	}
	for k, v := range params {
		r.Params[k] = v
	}
	return r
}

// pvRequest is what a static PV asks for: min = max = its capacity.
func pvRequest(pv *corev1.PersistentVolume, params map[string]string) (phase.Request, string) {
	st := stagedFrom(pv, nil, renderInputs{params: params})
	c := st.Capacity
	return phase.Request{VolumeMode: st.VolumeMode, AccessModes: pv.Spec.AccessModes, MinCapacity: c, MaxCapacity: &c, Params: st.Params}, st.Handle
}

func stagedFrom(pv *corev1.PersistentVolume, pvc *corev1.PersistentVolumeClaim, in renderInputs) phase.Staged {
	st := phase.Staged{VolumeMode: corev1.PersistentVolumeFilesystem, AccessModes: pv.Spec.AccessModes, Params: map[string]string{}, ReadOnly: in.readOnly}
	if pv.Spec.VolumeMode != nil {
		st.VolumeMode = *pv.Spec.VolumeMode
	}
	if q, ok := pv.Spec.Capacity[corev1.ResourceStorage]; ok {
		st.Capacity = q.Value()
	}
	if pv.Spec.CSI != nil {
		st.Handle = pv.Spec.CSI.VolumeHandle
		st.Params = volume.UserParams(pv.Spec.CSI.VolumeAttributes)
		st.ReadOnly = st.ReadOnly || pv.Spec.CSI.ReadOnly
	}
	if pvc != nil {
		st.AccessModes = pvc.Spec.AccessModes
	}
	for k, v := range in.params {
		st.Params[k] = v
	}
	return st
}

// offlinePVCs serves get_pvc from the --pvc file.
type offlinePVCs struct{ pvc *corev1.PersistentVolumeClaim }

func (o offlinePVCs) GetPVC(_ context.Context, namespace, name string) (map[string]any, error) {
	if o.pvc == nil || o.pvc.Name != name || o.pvc.Namespace != namespace {
		return nil, fmt.Errorf("PersistentVolumeClaim %s/%s not found (offline, get_pvc sees only the --pvc file)", namespace, name)
	}
	return phase.ObjectVar(o.pvc)
}

// renderInline renders a phase of an inline ephemeral volume as the node
// plugin of the pod's node runs it (controllerserver's CreateInline and
// DeleteInline, nodeserver's staging): its id is the kubelet's, its params
// its volumeAttributes, its context has `pod` and `ephemeral`, and every pod
// runs on the node (--node, else the pod's spec.nodeName).
func renderInline(ctx context.Context, in renderInputs, p *v1alpha1.PavProvisioner, node *corev1.Node, eval *phase.Evaluator, out *rendered) (*rendered, error) {
	b, err := os.ReadFile(in.inlinePod)
	if err != nil {
		return nil, fmt.Errorf("--inline-pod: %w", err)
	}
	pod := &corev1.Pod{}
	if err := yaml.UnmarshalStrict(b, pod); err != nil {
		return nil, fmt.Errorf("--inline-pod %s: %w", in.inlinePod, err)
	}
	var src *corev1.CSIVolumeSource
	var name string
	for _, v := range pod.Spec.Volumes {
		if v.CSI != nil && v.CSI.Driver == p.Name && (in.inlineVolume == "" || in.inlineVolume == v.Name) {
			src, name = v.CSI, v.Name
			break
		}
	}
	if src == nil {
		return nil, fmt.Errorf("--inline-pod %s has no csi volume %q of driver %s", in.inlinePod, in.inlineVolume, p.Name)
	}
	if pod.UID == "" {
		pod.UID = "00000000-0000-4000-8000-000000000000" // the API server gives one
	}
	if pod.Namespace == "" {
		pod.Namespace = "default"
	}
	nodeName := pod.Spec.NodeName
	if node != nil {
		nodeName = node.Name
	}
	if nodeName == "" {
		return nil, fmt.Errorf("an inline volume's pods run on its pod's node: give --node, or spec.nodeName in the pod")
	}
	attrs := map[string]string{}
	for k, v := range src.VolumeAttributes {
		attrs[k] = v
	}
	for k, v := range in.params {
		attrs[k] = v
	}
	params, err := volume.InlineParams(attrs)
	if err != nil {
		return nil, err
	}
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	id := controllerserver.InlineVolumeID(pod.UID, name)
	iv := controllerserver.InlineVolume{ID: id, Node: nodeName, Params: params,
		Pod: v1alpha1.EphemeralPod{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, ServiceAccountName: sa}}
	if !p.Spec.HasMode(v1alpha1.Ephemeral) {
		return nil, fmt.Errorf("PavProvisioner %q does not allow inline ephemeral volumes: add Ephemeral to its spec.provisioningModes", p.Name)
	}
	r, err := controllerserver.InlineRequest(ctx, eval, p, iv)
	if err != nil {
		return nil, err
	}
	ph := out.Phase
	inlineOp := func(key string) operationOf {
		return func(t corev1.PodTemplateSpec) podrunner.Operation {
			op := controllerserver.PodOperation(p.Name, ph, key, t)
			op.NodeName = nodeName
			return op
		}
	}
	capacity := int64(0)
	if in.capacity != "" {
		if capacity, err = phase.ParseCapacity(in.capacity, phase.Floor); err != nil {
			return nil, fmt.Errorf("--capacity: %w", err)
		}
	}
	switch ph {
	case v1alpha1.PhaseValidation:
		vars, err := phase.ValidationVars(r, phase.Objects{}, "")
		if err != nil {
			return nil, err
		}
		cfg, err := eval.Validation(ctx, p, vars)
		if err != nil {
			return nil, err
		}
		v := &renderedValidation{VolumeModes: cfg.VolumeModes, AccessModes: cfg.AccessModes, MinCapacity: cfg.MinCapacity, MaxCapacity: cfg.MaxCapacity, Result: "the request passes spec.volumeValidation"}
		if err := cfg.CheckRequest(r); err != nil {
			v.Result = "REJECTED: " + err.Error()
		}
		out.Validation = v
		return out, setPod(out, ph, cfg.PodTemplate, in, inlineOp(id))
	case v1alpha1.PhaseCreation:
		if p.Spec.VolumeCreation == nil || p.Spec.VolumeCreation.Data == nil {
			out.Creation = &renderedCreation{Handle: id, Capacity: &r.MinCapacity}
			out.Note = "no spec.volumeCreation: the staging pod alone makes an inline volume, of the requested capacity"
			return out, nil
		}
		vars, err := phase.CreationVars(r, phase.Objects{}, id)
		if err != nil {
			return nil, err
		}
		cfg, err := eval.Creation(ctx, p, vars)
		if err != nil {
			return nil, err
		}
		if cfg.Handle != "" && cfg.Handle != id {
			return nil, fmt.Errorf("spec.volumeCreation.handle is %q, but the handle of an inline ephemeral volume is always its CSI volume id %s: leave it out for inline volumes", cfg.Handle, id)
		}
		out.Creation = &renderedCreation{Handle: id, Capacity: cfg.Capacity}
		return out, setPod(out, ph, cfg.PodTemplate, in, inlineOp(id))
	case v1alpha1.PhaseDeletion:
		vars, err := phase.DeletionVars(r, phase.Objects{}, id, id, capacity)
		if err != nil {
			return nil, err
		}
		cfg, err := eval.Deletion(ctx, p, vars)
		if err != nil {
			return nil, err
		}
		return out, setPod(out, ph, cfg.PodTemplate, in, inlineOp(controllerserver.DeletionKey(id)))
	case v1alpha1.PhaseStaging, v1alpha1.PhaseUnstaging:
		if capacity == 0 {
			capacity = r.MinCapacity
		}
		st := phase.Staged{VolumeMode: r.VolumeMode, AccessModes: r.AccessModes, Capacity: capacity, Params: params, Handle: id,
			ReadOnly: in.readOnly, Pod: r.Pod}
		vars, err := phase.StagingVars(st, phase.Objects{Node: node})
		if err != nil {
			return nil, err
		}
		var cfg *phase.PodConfig
		if ph == v1alpha1.PhaseStaging {
			cfg, err = eval.Staging(ctx, p, vars)
		} else {
			cfg, err = eval.Unstaging(ctx, p, vars)
		}
		if err != nil {
			return nil, err
		}
		stateDir := in.stateDir
		if stateDir == "" {
			stateDir = driver.DefaultStateDir(p.Name)
		}
		return out, setPod(out, ph, cfg.PodTemplate, in, func(t corev1.PodTemplateSpec) podrunner.Operation {
			return nodeserver.PodOperation(nodeName, stateDir, p.Name, ph, id, t)
		})
	}
	return nil, fmt.Errorf("--phase must be validation, creation, deletion, staging or unstaging, got %q", in.phase)
}
