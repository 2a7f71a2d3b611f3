// Package compat is what pav needs to read what other versions of itself
// wrote, and to refuse what it cannot: the format versions of what pav
// persists (the PavVolume and PavSnapshot records, a node's state.json), the
// release that introduced each format, and the error that names both when a
// record is newer than this binary reads (a downgrade).
//
// Every persisted format carries its version from this release on (v0.2.0's
// had none: those read as format 0). A reader migrates an older format to its
// own, one step per version, each step with a test of its own; it never reads
// a newer one, because the fields a newer pav added would be dropped or
// misread silently (the API server prunes fields an older CRD does not know,
// and json.Unmarshal ignores them), and the next write would lose them.
package compat

import (
	"errors"
	"fmt"
)

// Release is this binary's version (the drivers and the manager set it from
// their -ldflags version at start), named in the errors about formats.
var Release = "unknown"

// ErrNewerFormat is in the chain of every NewerError.
var ErrNewerFormat = errors.New("written by a newer pav")

// Format is one persisted format: what it is, its current version (the one
// this pav writes) and the release that introduced each version.
type Format struct {
	// What names it for people ("PavVolume", "state.json").
	What string
	// Current is the version this pav writes, and the newest it reads.
	Current int
	// Releases names the release that first wrote each version; version 0 is
	// everything written before the format had a version.
	Releases map[int]string
}

// ReleaseOf names the release that introduced version v, or a description
// of a version this pav does not know.
func (f Format) ReleaseOf(v int) string {
	if r, ok := f.Releases[v]; ok {
		return r
	}
	if v > f.Current {
		return "a pav newer than " + Release
	}
	return "an unknown pav"
}

// Check refuses version v of the format when this pav does not read it (v is
// newer than Current, or negative); name says which object it is.
func (f Format) Check(name string, v int) error {
	if v >= 0 && v <= f.Current {
		return nil
	}
	return &NewerError{Format: f, Name: name, Version: v}
}

// NewerError is a persisted object this pav does not read: it was written by
// a newer pav (pav was downgraded), or is corrupt.
type NewerError struct {
	Format  Format
	Name    string
	Version int
}

func (e *NewerError) Error() string {
	if e.Version < 0 {
		return fmt.Sprintf("%s %s has format version %d, which no pav writes: it is corrupt; restore it from a backup, or delete it and clean up by hand",
			e.Format.What, e.Name, e.Version)
	}
	return fmt.Sprintf("%s %s has format version %d (written by %s), newer than version %d, the newest this pav (%s) reads: "+
		"pav was downgraded, and this version would misread it; downgrading is not supported while such objects exist: install the newer pav again",
		e.Format.What, e.Name, e.Version, e.Format.ReleaseOf(e.Version), e.Format.Current, Release)
}

// Unwrap makes errors.Is(err, ErrNewerFormat) hold.
func (e *NewerError) Unwrap() error { return ErrNewerFormat }
