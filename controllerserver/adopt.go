package controllerserver

// Adoption of the volumes v0.2.0 created. v0.2.0 kept no PavVolume records:
// what later phases need of a volume it created (the claim, its StorageClass,
// the request) went into the volume's CSI volume attributes, which
// external-provisioner copied into the PV. Without a record, pav would take
// such a volume for a static one: DeleteVolume would answer OK without
// running the deletion pod (a backend left behind), and expansion and
// snapshots would find no volume. So, when the controller plugin starts and
// before it serves, each of them gets a record built from its PV, marked
// adopted, and is from then on like any volume pav created.
//
// What may seed a record: only the PV, which tenants cannot write (only
// external-provisioner, Kubernetes and cluster administrators do); never the
// PVC annotation v0.2.0 also wrote (volume.AnnotationCreated), which anyone
// who may edit the claim can forge. A PV is adopted only if it names this
// driver, says external-provisioner made it for this driver
// (pv.kubernetes.io/provisioned-by), and carries v0.2.0's attributes (the
// claim snapshot: volumes pav made since have a record, and carry none). A
// handle already recorded for another volume is never adopted (two records of
// one handle would let either volume's deletion delete the other's data), nor
// one that several PVs share: their deletion is refused, naming them
// (legacyRefusal), until a human tells which is right.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/grpcerr"
	"github.com/pods-as-volumes/pav/internal/records"
	"github.com/pods-as-volumes/pav/internal/volume"
)

const (
	// AnnotationProvisionedBy is external-provisioner's annotation on the PVs
	// it creates: the driver that provisioned the volume.
	AnnotationProvisionedBy = "pv.kubernetes.io/provisioned-by"
	// legacyKeyClaim is v0.2.0's volume attribute holding legacyClaim.
	legacyKeyClaim = volume.KeyPrefix + "claim"
	// legacyRelease is the release whose volumes have legacyKeyClaim.
	legacyRelease = "v0.2.0"
	// pvPageSize bounds one page of the PV list.
	pvPageSize = 500
)

// legacyClaim is v0.2.0's volume.Claim, the JSON of legacyKeyClaim: what a
// volume was created from.
type legacyClaim struct {
	PVC                  *corev1.PersistentVolumeClaim       `json:"pvc,omitempty"`
	SC                   *storagev1.StorageClass             `json:"sc,omitempty"`
	RequestedVolumeMode  corev1.PersistentVolumeMode         `json:"requestedVolumeMode"`
	RequestedAccessModes []corev1.PersistentVolumeAccessMode `json:"requestedAccessModes"`
	RequestedMinCapacity int64                               `json:"requestedMinCapacity"`
	RequestedMaxCapacity *int64                              `json:"requestedMaxCapacity,omitempty"`
	DefaultHandle        string                              `json:"defaultHandle"`
}

// IsLegacyVolume says whether pv is a volume an older pav (v0.2.0) created
// for driver and kept no record of: it names the driver, external-provisioner
// made it for the driver, and it carries v0.2.0's volume attributes.
func IsLegacyVolume(pv *corev1.PersistentVolume, driver string) bool {
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != driver || pv.Annotations[AnnotationProvisionedBy] != driver {
		return false
	}
	_, claim := pv.Spec.CSI.VolumeAttributes[legacyKeyClaim]
	_, capacity := pv.Spec.CSI.VolumeAttributes[volume.KeyCapacity]
	return claim && capacity
}

// AdoptedRecord is the record of a legacy volume (IsLegacyVolume), built from
// its PV alone, Created, marked adopted at now. An error says which attribute
// cannot be read.
func AdoptedRecord(pv *corev1.PersistentVolume, now time.Time) (*v1alpha1.PavVolume, error) {
	attrs := pv.Spec.CSI.VolumeAttributes
	var c legacyClaim
	if err := json.Unmarshal([]byte(attrs[legacyKeyClaim]), &c); err != nil {
		return nil, fmt.Errorf("PersistentVolume %s: volume attribute %s (written by pav %s) is not a claim snapshot: %w", pv.Name, legacyKeyClaim, legacyRelease, err)
	}
	// The capacity v0.2.0's deletion pod would have had: the PV's, which is
	// what CreateVolume reported (v0.2.0 could not grow volumes).
	capacity, err := strconv.ParseInt(attrs[volume.KeyCapacity], 10, 64)
	if q, ok := pv.Spec.Capacity[corev1.ResourceStorage]; ok {
		capacity, err = q.Value(), nil
	}
	if err != nil || capacity <= 0 {
		return nil, fmt.Errorf("PersistentVolume %s: no capacity: neither spec.capacity.storage nor volume attribute %s is a positive number of bytes", pv.Name, volume.KeyCapacity)
	}
	sp := v1alpha1.PavVolumeSpec{
		VolumeName:           pv.Name, // external-provisioner names the PV after the CSI volume
		RequestedVolumeMode:  c.RequestedVolumeMode,
		RequestedAccessModes: c.RequestedAccessModes,
		RequestedMinCapacity: c.RequestedMinCapacity,
		RequestedMaxCapacity: c.RequestedMaxCapacity,
		Params:               volume.UserParams(attrs),
		DefaultHandle:        orDefault(c.DefaultHandle, pv.Name),
		PVC:                  c.PVC,
		SC:                   c.SC,
		Adopted:              &v1alpha1.VolumeAdoption{PersistentVolume: pv.Name, Release: legacyRelease, Time: metav1.NewTime(now)},
	}
	if sp.RequestedVolumeMode == "" {
		sp.RequestedVolumeMode = corev1.PersistentVolumeFilesystem
		if pv.Spec.VolumeMode != nil {
			sp.RequestedVolumeMode = *pv.Spec.VolumeMode
		}
	}
	if len(sp.RequestedAccessModes) == 0 {
		sp.RequestedAccessModes = pv.Spec.AccessModes
	}
	switch {
	case c.PVC != nil:
		sp.Claim = c.PVC.Namespace + "/" + c.PVC.Name
	case pv.Spec.ClaimRef != nil:
		sp.Claim = pv.Spec.ClaimRef.Namespace + "/" + pv.Spec.ClaimRef.Name
	}
	return &v1alpha1.PavVolume{
		Spec:   sp,
		Status: v1alpha1.PavVolumeStatus{Phase: v1alpha1.VolumeCreated, Handle: pv.Spec.CSI.VolumeHandle, Capacity: capacity},
	}, nil
}

// AdoptLegacyVolumes gives a record to every legacy volume of this
// provisioner that has none (see the file's comment). It reads every PV once
// (paged); the driver calls it when the controller plugin starts, after the
// records have synced and before it serves, and again until it succeeds.
// It returns how many volumes it adopted.
func (s *Server) AdoptLegacyVolumes(ctx context.Context, driver string) (int, error) {
	var legacy []*corev1.PersistentVolume
	opts := metav1.ListOptions{Limit: pvPageSize}
	for {
		l, err := s.Client.PersistentVolumes().List(ctx, opts)
		if err != nil {
			return 0, fmt.Errorf("listing PersistentVolumes to adopt the volumes pav %s created: %w", legacyRelease, err)
		}
		for i := range l.Items {
			if IsLegacyVolume(&l.Items[i], driver) {
				legacy = append(legacy, &l.Items[i])
			}
		}
		if opts.Continue = l.Continue; opts.Continue == "" {
			break
		}
	}
	return s.adopt(ctx, legacy, time.Now())
}

// adopt records the legacy volumes pvs (IsLegacyVolume) that have no record,
// and remembers why it refuses any (legacyRefusal).
func (s *Server) adopt(ctx context.Context, pvs []*corev1.PersistentVolume, now time.Time) (int, error) {
	logger := klog.FromContext(ctx)
	byHandle := map[string][]string{}
	for _, pv := range pvs {
		byHandle[pv.Spec.CSI.VolumeHandle] = append(byHandle[pv.Spec.CSI.VolumeHandle], pv.Name)
	}
	refused := map[string]error{}
	adopted := 0
	for _, pv := range pvs {
		handle := pv.Spec.CSI.VolumeHandle
		if names := byHandle[handle]; len(names) > 1 {
			sort.Strings(names)
			refused[handle] = grpcerr.Errorf(codes.FailedPrecondition,
				"PersistentVolumes %s, which pav %s created, all have volume handle %q: pav adopts none of them, since deleting one would delete the data of the others; a human must tell which is right, delete the other PVs (with reclaim policy Retain first), and restart the controller plugin",
				strings.Join(names, ", "), legacyRelease, handle)
			continue
		}
		ok, err := s.adoptOne(ctx, pv, now)
		var coded *grpcerr.Coded
		switch {
		case err == nil && ok:
			adopted++
			logger.Info("Adopted a volume pav "+legacyRelease+" created", "pv", pv.Name, "handle", handle)
		case err == nil:
		case errors.As(err, &coded):
			// Refused for good: its operations say why.
			refused[handle] = err
		default:
			return adopted, err
		}
	}
	for handle, err := range refused {
		logger.Error(err, "Not adopting a volume pav "+legacyRelease+" created", "handle", handle)
	}
	s.legacyMu.Lock()
	s.legacyRefused = refused
	s.legacyMu.Unlock()
	return adopted, nil
}

// adoptOne records one legacy volume, unless it has a record already: false
// then. A Coded error is a refusal (final); any other is to retry.
func (s *Server) adoptOne(ctx context.Context, pv *corev1.PersistentVolume, now time.Time) (bool, error) {
	handle := pv.Spec.CSI.VolumeHandle
	rec, err := s.Records.Get(ctx, pv.Name)
	if errors.Is(err, records.ErrOtherOwner) {
		// Another provisioner's record, or a collision of record names.
		return false, grpcerr.WithCode(codes.FailedPrecondition, fmt.Errorf("pav does not adopt PersistentVolume %s, which pav %s created: %w", pv.Name, legacyRelease, err))
	}
	if err != nil {
		return false, err
	}
	if rec != nil {
		if rec.Status.Handle != handle {
			return false, grpcerr.Errorf(codes.FailedPrecondition, "PersistentVolume %s, which pav %s created, has volume handle %q, but pav's record %s of that volume has handle %q: pav does not adopt it; a human must tell which is right",
				pv.Name, legacyRelease, handle, rec.Name, rec.Status.Handle)
		}
		return false, nil // adopted before (or recorded by CreateVolume)
	}
	// Never a handle another volume has (asked of the API server, not the
	// cache): that volume's record rules it.
	others, err := s.Records.ByHandle(ctx, handle, true)
	if err != nil {
		return false, err
	}
	if len(others) > 0 {
		o := others[0]
		return false, grpcerr.Errorf(codes.FailedPrecondition, "PersistentVolume %s, which pav %s created, has volume handle %q, which is already the handle of volume %s (claim %s): pav does not adopt it, since deleting either would delete the other's data; a human must tell which is right",
			pv.Name, legacyRelease, handle, o.Spec.VolumeName, orDefault(o.Spec.Claim, "unknown"))
	}
	v, err := AdoptedRecord(pv, now)
	if err != nil {
		return false, grpcerr.WithCode(codes.FailedPrecondition, err)
	}
	if _, err := s.Records.Create(ctx, v); err != nil {
		if apierrors.IsAlreadyExists(err) {
			// Written meanwhile by another process: the next pass sees it.
			return false, fmt.Errorf("adopting PersistentVolume %s: %w", pv.Name, err)
		}
		return false, err
	}
	return true, nil
}

// legacyRefusal is why the legacy volume of a handle was not adopted (several
// legacy PVs share it, or another volume's record has it), or nil. Every
// operation on such a handle is refused (byHandle), that other volume's
// included: CSI names a volume by its handle alone, so pav cannot tell which
// of the two a DeleteVolume is for.
func (s *Server) legacyRefusal(handle string) error {
	s.legacyMu.Lock()
	defer s.legacyMu.Unlock()
	return s.legacyRefused[handle]
}
