package manager

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/pods-as-volumes/pav/internal/kubeconfig"
	"github.com/pods-as-volumes/pav/internal/phase"
)

// Settings say how the manager deploys every provisioner's drivers: what it
// changes in the manifests of deploy/provisioner. A zero field keeps what the
// manifests say. They come from the file of ConfigMap pav-manager (config.yaml)
// and flags; the manager reads them once at start (kustomize's configMapGenerator
// rolls the Deployment when they change).
type Settings struct {
	Images          Images            `json:"images,omitempty"`
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// LogLevel is the --v of the drivers and their sidecars.
	LogLevel *int `json:"logLevel,omitempty"`
	// PodTimeout is the drivers' --pod-timeout.
	PodTimeout *PodTimeout `json:"podTimeout,omitempty"`
	// PodReport is the drivers' --pod-report: how pods report (auto, exec,
	// sidecar).
	PodReport string `json:"podReport,omitempty"`
	// KubeAPI is the API client rate of the drivers and of the sidecars that
	// talk to the API server (their --kube-api-qps and --kube-api-burst), each
	// process's own. At 1,000 claims at once the controller plugin's (some 14
	// requests a creation) bounds how fast PVs appear; a cluster whose
	// control plane takes more raises it here.
	KubeAPI    *kubeconfig.Rate `json:"kubeAPI,omitempty"`
	NodePlugin NodePlugin       `json:"nodePlugin,omitempty"`
	Resources  Resources        `json:"resources,omitempty"`
}

// PodTimeout is a Go duration ("10m", "90s"; "0s": no limit).
type PodTimeout struct{ time.Duration }

// UnmarshalJSON reads a duration string and names the setting when it is not one.
func (d *PodTimeout) UnmarshalJSON(b []byte) (err error) {
	d.Duration, err = parseDuration("podTimeout", b)
	return err
}

// MarshalJSON writes the duration string.
func (d PodTimeout) MarshalJSON() ([]byte, error) { return json.Marshal(d.Duration.String()) }

// ForgottenGrace is a Go duration ("2m"; "0s": never).
type ForgottenGrace struct{ time.Duration }

// UnmarshalJSON reads a duration string and names the setting when it is not one.
func (d *ForgottenGrace) UnmarshalJSON(b []byte) (err error) {
	d.Duration, err = parseDuration("nodePlugin.unstageForgottenAfter", b)
	return err
}

// MarshalJSON writes the duration string.
func (d ForgottenGrace) MarshalJSON() ([]byte, error) { return json.Marshal(d.Duration.String()) }

// parseDuration reads the duration string of the setting key.
func parseDuration(key string, b []byte) (time.Duration, error) {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return 0, fmt.Errorf("%s must be a duration string such as 10m or 90s, got %s", key, b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%s must be a duration such as 10m or 90s, got %q", key, s)
	}
	return v, nil
}

// Images of the containers the manager deploys.
type Images struct {
	Pav                 string `json:"pav,omitempty"`
	CSIProvisioner      string `json:"csiProvisioner,omitempty"`
	NodeDriverRegistrar string `json:"nodeDriverRegistrar,omitempty"`
	// CSIResizer and CSISnapshotter: the external-resizer and external-snapshotter
	// sidecars, deployed only to provisioners with the phases they need.
	CSIResizer     string `json:"csiResizer,omitempty"`
	CSISnapshotter string `json:"csiSnapshotter,omitempty"`
	// LivenessProbe is the livenessprobe sidecar of both workloads: the
	// drivers' liveness probe goes through it (their CSI Probe).
	LivenessProbe string `json:"livenessProbe,omitempty"`
	// CSISnapshotMetadata is the external-snapshot-metadata sidecar, deployed
	// only to provisioners with spec.snapshotMetadata (default
	// DefaultSnapshotMetadataImage).
	CSISnapshotMetadata string `json:"csiSnapshotMetadata,omitempty"`
}

// NodePlugin says where the node plugins (the DaemonSet) run. A nil field keeps
// the manifest's value; an empty one removes it.
type NodePlugin struct {
	NodeSelector map[string]string   `json:"nodeSelector,omitempty"`
	Tolerations  []corev1.Toleration `json:"tolerations,omitempty"`
	// UnstageForgottenAfter is the node plugins' --unstage-forgotten-after:
	// how long a staging the kubelet forgot (it restarted while unstaging it)
	// must have gone unused before the node plugin unstages it; "0s": never.
	UnstageForgottenAfter *ForgottenGrace `json:"unstageForgottenAfter,omitempty"`
	// StageAhead is the node plugins' --stage-ahead: whether they start a
	// volume's staging when its pod is bound to their node rather than at
	// the kubelet's NodeStageVolume (default true).
	StageAhead *bool `json:"stageAhead,omitempty"`
}

// Resources of each container; nil keeps the manifest's requests.
type Resources struct {
	// Controller is the pav container of the controller StatefulSet.
	Controller *corev1.ResourceRequirements `json:"controller,omitempty"`
	// CSIProvisioner is the external-provisioner sidecar.
	CSIProvisioner *corev1.ResourceRequirements `json:"csiProvisioner,omitempty"`
	// Node is the pav container of the node DaemonSet.
	Node *corev1.ResourceRequirements `json:"node,omitempty"`
	// NodeDriverRegistrar is the registrar sidecar of the node DaemonSet.
	NodeDriverRegistrar *corev1.ResourceRequirements `json:"nodeDriverRegistrar,omitempty"`
	// CSIResizer is the external-resizer sidecar (spec.volumeExpansion only).
	CSIResizer *corev1.ResourceRequirements `json:"csiResizer,omitempty"`
	// CSISnapshotter is the external-snapshotter sidecar (spec.snapshotCreation only).
	CSISnapshotter *corev1.ResourceRequirements `json:"csiSnapshotter,omitempty"`
	// LivenessProbe is the livenessprobe sidecar of both workloads.
	LivenessProbe *corev1.ResourceRequirements `json:"livenessProbe,omitempty"`
	// CSISnapshotMetadata is the external-snapshot-metadata sidecar
	// (spec.snapshotMetadata only).
	CSISnapshotMetadata *corev1.ResourceRequirements `json:"csiSnapshotMetadata,omitempty"`
}

// LoadSettings reads a settings file strictly: an unknown key is an error that
// names it (a misspelt key would otherwise be ignored without a word).
func LoadSettings(path string) (Settings, error) {
	var s Settings
	data, err := os.ReadFile(path)
	if err != nil {
		return s, fmt.Errorf("manager settings: %w", err)
	}
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		return s, fmt.Errorf("manager settings %s: not YAML: %w", path, err)
	}
	if err := phase.UnmarshalStrict(j, &s); err != nil {
		return s, fmt.Errorf("manager settings %s: %w (see deploy/manager/config.yaml for the keys)", path, err)
	}
	if err := s.Validate(); err != nil {
		return s, fmt.Errorf("manager settings %s: %w", path, err)
	}
	return s, nil
}

// Validate names the setting to fix.
func (s Settings) Validate() error {
	switch s.ImagePullPolicy {
	case "", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		return fmt.Errorf("imagePullPolicy must be Always, IfNotPresent or Never, got %q", s.ImagePullPolicy)
	}
	if s.LogLevel != nil && (*s.LogLevel < 0 || *s.LogLevel > 10) {
		return fmt.Errorf("logLevel must be between 0 and 10, got %d", *s.LogLevel)
	}
	if a := s.KubeAPI; a != nil {
		if err := a.Validate(); err != nil {
			return fmt.Errorf("kubeAPI (qps, burst) sets every container's flags: %w", err)
		}
	}
	switch s.PodReport {
	case "", "auto", "exec", "sidecar":
	default:
		return fmt.Errorf("podReport must be auto, exec or sidecar, got %q", s.PodReport)
	}
	if s.PodTimeout != nil && s.PodTimeout.Duration < 0 {
		return fmt.Errorf("podTimeout must not be negative (0s means no limit), got %v", s.PodTimeout.Duration)
	}
	if g := s.NodePlugin.UnstageForgottenAfter; g != nil && g.Duration < 0 {
		return fmt.Errorf("nodePlugin.unstageForgottenAfter must not be negative (0s means never), got %v", g.Duration)
	}
	for _, r := range []struct {
		key string
		r   *corev1.ResourceRequirements
	}{
		{"resources.controller", s.Resources.Controller},
		{"resources.csiProvisioner", s.Resources.CSIProvisioner},
		{"resources.node", s.Resources.Node},
		{"resources.nodeDriverRegistrar", s.Resources.NodeDriverRegistrar},
		{"resources.csiResizer", s.Resources.CSIResizer},
		{"resources.csiSnapshotter", s.Resources.CSISnapshotter},
		{"resources.livenessProbe", s.Resources.LivenessProbe},
		{"resources.csiSnapshotMetadata", s.Resources.CSISnapshotMetadata},
	} {
		if r.r == nil {
			continue
		}
		for name, req := range r.r.Requests {
			if lim, ok := r.r.Limits[name]; ok && req.Cmp(lim) > 0 {
				return fmt.Errorf("%s: the %s request %s is above its limit %s", r.key, name, req.String(), lim.String())
			}
		}
	}
	return nil
}

// Overrides are the `pav manager` flags that override settings; empty ones
// (and negative numbers) override nothing.
type Overrides struct {
	PavImage, CSIProvisionerImage, NodeDriverRegistrarImage string
	ImagePullPolicy                                         string
	LogLevel                                                int
	PodTimeout                                              time.Duration
}

// Apply returns the settings with the overrides applied, validated.
func (o Overrides) Apply(s Settings) (Settings, error) {
	if o.PavImage != "" {
		s.Images.Pav = o.PavImage
	}
	if o.CSIProvisionerImage != "" {
		s.Images.CSIProvisioner = o.CSIProvisionerImage
	}
	if o.NodeDriverRegistrarImage != "" {
		s.Images.NodeDriverRegistrar = o.NodeDriverRegistrarImage
	}
	if o.ImagePullPolicy != "" {
		s.ImagePullPolicy = corev1.PullPolicy(o.ImagePullPolicy)
	}
	if o.LogLevel >= 0 {
		v := o.LogLevel
		s.LogLevel = &v
	}
	if o.PodTimeout >= 0 {
		s.PodTimeout = &PodTimeout{o.PodTimeout}
	}
	return s, s.Validate()
}
