package phase

import (
	"fmt"
	"slices"
)

// RequestError is a request that spec.volumeValidation refuses. Capacity tells
// a capacity outside the provisioner's bounds (CSI's OUT_OF_RANGE) from a
// volume or access mode it does not support (INVALID_ARGUMENT); grpcerr.Status
// maps it so.
type RequestError struct {
	Msg      string
	Capacity bool
}

func (e *RequestError) Error() string { return e.Msg }

func requestErr(capacity bool, format string, args ...any) error {
	return &RequestError{Msg: fmt.Sprintf(format, args...), Capacity: capacity}
}

// CheckRequest applies spec.volumeValidation's modes and capacity bounds to a
// request, or returns a *RequestError. For dynamic provisioning PaV compares the
// PVC's request with the maximum and its limit with the minimum; a static PV has
// min = max = its size.
func (c *ValidationConfig) CheckRequest(r Request) error {
	if !slices.Contains(c.VolumeModes, r.VolumeMode) {
		return requestErr(false, "volume mode %s is not supported by this provisioner (spec.volumeValidation.volumeModes: %v)", r.VolumeMode, c.VolumeModes)
	}
	for _, m := range r.AccessModes {
		if !slices.Contains(c.AccessModes, m) {
			return requestErr(false, "access mode %s is not supported by this provisioner (spec.volumeValidation.accessModes: %v)", m, c.AccessModes)
		}
	}
	if c.MaxCapacity != nil && r.MinCapacity > *c.MaxCapacity {
		return requestErr(true, "requested capacity %s is above the provisioner's maximum %s (spec.volumeValidation.maxCapacity)", FormatBytes(r.MinCapacity), FormatBytes(*c.MaxCapacity))
	}
	if r.MaxCapacity != nil && *r.MaxCapacity < c.MinCapacity {
		return requestErr(true, "capacity limit %s is below the provisioner's minimum %s (spec.volumeValidation.minCapacity)", FormatBytes(*r.MaxCapacity), FormatBytes(c.MinCapacity))
	}
	return nil
}
