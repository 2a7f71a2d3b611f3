package filesystem

import (
	"testing"

	"github.com/pods-as-volumes/pav/sanity"
)

// TestSanity runs every csi-sanity spec with Filesystem (mount) volumes.
func TestSanity(t *testing.T) { sanity.Run(t, "mount") }
