package block

import (
	"testing"

	"github.com/pods-as-volumes/pav/sanity"
)

// TestSanity runs every csi-sanity spec with Block volumes (real loop devices).
func TestSanity(t *testing.T) { sanity.Run(t, "block") }
