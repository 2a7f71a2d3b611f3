package phase

import (
	"bufio"
	"fmt"
	"strconv"
	"strings"
)

// BlockRange is one range of a snapshot's blocks, in bytes.
type BlockRange struct {
	Offset, Length int64
}

// End is the first byte after the range.
func (r BlockRange) End() int64 { return r.Offset + r.Length }

// blocksFix is what every error about /pav/blocks ends with.
const blocksFix = `write one range per line, "OFFSET LENGTH" in bytes (decimal), sorted by offset, never overlapping, each inside the snapshot's capacity`

// ParseBlocks reads a snapshotMetadata pod's /pav/blocks: one range per line,
// "OFFSET LENGTH" in bytes (decimal integers, separated by blanks), sorted by
// offset and never overlapping (a range may start where the one before it
// ends), each inside capacity; blank lines and lines starting with # are
// skipped. An error names the line and says how to write the file.
func ParseBlocks(s string, capacity int64) ([]BlockRange, error) {
	var out []BlockRange
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 0, 4096), len(s)+1)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		bad := func(format string, args ...any) error {
			return fmt.Errorf("/pav/blocks line %d (%q): %s: %s", line, abbreviate(text, 80), fmt.Sprintf(format, args...), blocksFix)
		}
		f := strings.Fields(text)
		if len(f) != 2 {
			return nil, bad("want 2 fields, OFFSET and LENGTH, got %d", len(f))
		}
		off, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || off < 0 {
			return nil, bad("the offset %q is not a non-negative integer", f[0])
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil || n <= 0 {
			return nil, bad("the length %q is not a positive integer", f[1])
		}
		r := BlockRange{Offset: off, Length: n}
		if r.End() < off || r.End() > capacity {
			return nil, bad("the range ends at byte %d, beyond the snapshot's capacity of %d bytes", off+n, capacity)
		}
		if k := len(out); k > 0 && off < out[k-1].End() {
			prev := out[k-1]
			if off < prev.Offset {
				return nil, bad("not sorted: it starts before the range above it (%d %d)", prev.Offset, prev.Length)
			}
			return nil, bad("it overlaps the range above it (%d %d, which ends at byte %d)", prev.Offset, prev.Length, prev.End())
		}
		out = append(out, r)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("/pav/blocks: %v", err)
	}
	return out, nil
}

func abbreviate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
