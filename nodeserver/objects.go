package nodeserver

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/pods-as-volumes/pav/internal/grpcerr"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/internal/volume"
)

// lookup reads the objects of a staging context: the volume's PV, the PVC
// bound to it and this Node. It reads what this one operation needs and
// nothing else, and keeps no cache: a node plugin's cost must not grow with
// the cluster (every node plugin watching every PV made the API server and
// every node pay for the size of the cluster, not for their work).
//
//   - A volume pav created carries its PV's name in the volume context
//     (volume.KeyPV): one GET, and the PV must name this driver and handle.
//   - Otherwise (a static PV, or a volume created before KeyPV existed) the PV
//     is found through the pods of this node that use it, which kubelet has
//     already scheduled here: one LIST of this node's pods (bounded by the
//     node's pod capacity, not by the cluster), then one GET per claim they
//     use and one per PV those claims are bound to.
//
// With no client (csi-sanity, another CO) the context has no objects.
func (s *Server) lookup(ctx context.Context, driver, handle string, vc map[string]string) (phase.Objects, error) {
	var objs phase.Objects
	if s.Client == nil {
		return objs, nil
	}
	var pv *corev1.PersistentVolume
	var err error
	if name := vc[volume.KeyPV]; name != "" {
		pv, err = s.Client.PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return objs, grpcerr.Errorf(codes.FailedPrecondition, "PersistentVolume %s, named in the volume context of volume %q, does not exist", name, handle)
		case err != nil:
			return objs, fmt.Errorf("reading PersistentVolume %s: %w", name, err)
		case pv.Spec.CSI == nil || pv.Spec.CSI.Driver != driver || pv.Spec.CSI.VolumeHandle != handle:
			return objs, grpcerr.Errorf(codes.FailedPrecondition, "PersistentVolume %s, named in the volume context of volume %q, is not that volume of driver %s (%s)", name, handle, driver, describeCSI(pv))
		}
	} else if pv, err = s.staticPV(ctx, driver, handle); err != nil {
		return objs, err
	}
	if pv != nil {
		objs.PV = pv
		if ref := pv.Spec.ClaimRef; ref != nil {
			pvc, err := s.Client.PersistentVolumeClaims(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
			switch {
			case err == nil && (ref.UID == "" || pvc.UID == ref.UID):
				objs.PVC = pvc
			case err != nil && !apierrors.IsNotFound(err):
				return objs, fmt.Errorf("reading PersistentVolumeClaim %s/%s: %w", ref.Namespace, ref.Name, err)
			}
		}
	}
	objs.Node, err = s.node(ctx)
	return objs, err
}

// node reads this node's Node, which every staging context has.
func (s *Server) node(ctx context.Context) (*corev1.Node, error) {
	node, err := s.Client.Nodes().Get(ctx, s.NodeID, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading Node %s: %w", s.NodeID, err)
	}
	return node, nil
}

// contextObjects are the objects of r's staging context: those a staging
// ahead read a moment ago (their checks are lookup's, and more), and the
// rest, or all of them, as lookup reads them.
func (s *Server) contextObjects(ctx context.Context, driver string, r stageRequest) (phase.Objects, error) {
	if r.read.PV == nil || s.Client == nil {
		return s.lookup(ctx, driver, r.handle, r.volumeContext)
	}
	objs := r.read
	var err error
	if objs.Node == nil {
		objs.Node, err = s.node(ctx)
	}
	return objs, err
}

// staticPV finds the PV of driver and handle among the PVs of the claims that
// pods on this node use (see lookup); nil if none does.
func (s *Server) staticPV(ctx context.Context, driver, handle string) (*corev1.PersistentVolume, error) {
	pods, err := s.Client.Pods("").List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", s.NodeID).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("listing the pods of node %s to find the PersistentVolume of volume %q: %w", s.NodeID, handle, err)
	}
	claims := map[string]bool{}
	for i := range pods.Items {
		for _, c := range claimsOf(&pods.Items[i]) {
			claims[c] = true
		}
	}
	keys := make([]string, 0, len(claims))
	for c := range claims {
		keys = append(keys, c)
	}
	sort.Strings(keys)
	seen := map[string]bool{}
	var found []*corev1.PersistentVolume
	for _, c := range keys {
		ns, name, _ := strings.Cut(c, "/")
		pvc, err := s.Client.PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading PersistentVolumeClaim %s: %w", c, err)
		}
		pvName := pvc.Spec.VolumeName
		if pvName == "" || seen[pvName] {
			continue
		}
		seen[pvName] = true
		pv, err := s.Client.PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading PersistentVolume %s: %w", pvName, err)
		}
		if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == driver && pv.Spec.CSI.VolumeHandle == handle {
			found = append(found, pv)
		}
	}
	switch len(found) {
	case 0:
		return nil, nil
	case 1:
		return found[0], nil
	}
	names := make([]string, len(found))
	for i, pv := range found {
		names[i] = pv.Name
	}
	sort.Strings(names)
	return nil, grpcerr.Errorf(codes.FailedPrecondition, "PersistentVolumes %s of driver %s all have volume handle %q: a handle must name one volume; delete all but one",
		strings.Join(names, ", "), driver, handle)
}

// claimsOf lists the "namespace/name" of the claims a pod uses, generic
// ephemeral volumes included (their claim is named <pod>-<volume>).
func claimsOf(pod *corev1.Pod) []string {
	var out []string
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.PersistentVolumeClaim != nil:
			out = append(out, pod.Namespace+"/"+v.PersistentVolumeClaim.ClaimName)
		case v.Ephemeral != nil:
			out = append(out, pod.Namespace+"/"+pod.Name+"-"+v.Name)
		}
	}
	return out
}

// mutableParams are the parameters of the VolumeAttributesClass a PV names
// (spec.volumeAttributesClassName), the staging context's mutableParams; nil
// when it names none (or without a client). One GET, only for a PV that names
// a class. VolumeAttributesClasses are cluster-scoped, immutable and written
// by administrators, and external-resizer names a class on the PV only once
// ControllerModifyVolume applied its parameters (external-provisioner at
// creation, once CreateVolume had them): they are the volume's.
func (s *Server) mutableParams(ctx context.Context, driver string, pv *corev1.PersistentVolume) (map[string]string, error) {
	if s.Client == nil || pv == nil || pv.Spec.VolumeAttributesClassName == nil || *pv.Spec.VolumeAttributesClassName == "" {
		return nil, nil
	}
	name := *pv.Spec.VolumeAttributesClassName
	vac, err := s.Client.VolumeAttributesClasses().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		// Kubernetes keeps a class while a PV or PVC names it (the
		// vac-protection finalizer): someone removed it by force.
		return nil, grpcerr.Errorf(codes.FailedPrecondition,
			"VolumeAttributesClass %s, named by PersistentVolume %s (spec.volumeAttributesClassName), does not exist: it was removed although the volume uses it; create it again (driverName %s, with the parameters the volume was given) so that the volume can be staged with them",
			name, pv.Name, driver)
	case err != nil:
		return nil, fmt.Errorf("reading VolumeAttributesClass %s of PersistentVolume %s: %w", name, pv.Name, err)
	case vac.DriverName != driver:
		return nil, grpcerr.Errorf(codes.FailedPrecondition,
			"VolumeAttributesClass %s, named by PersistentVolume %s (spec.volumeAttributesClassName), is for driver %s, not %s: its parameters are not this provisioner's; name a class of driver %s",
			name, pv.Name, vac.DriverName, driver, driver)
	}
	if len(vac.Parameters) == 0 {
		return nil, nil
	}
	return vac.Parameters, nil
}

func describeCSI(pv *corev1.PersistentVolume) string {
	if pv.Spec.CSI == nil {
		return "not a CSI volume"
	}
	return fmt.Sprintf("driver %s, volume handle %q", pv.Spec.CSI.Driver, pv.Spec.CSI.VolumeHandle)
}
