package phase

import (
	"strings"
	"testing"
)

func TestParseCapacity(t *testing.T) {
	for _, tc := range []struct {
		in      any
		r       Rounding
		want    int64
		wantErr string
	}{
		{in: int64(1), want: 1},
		{in: 42, want: 42},
		{in: float64(1024), want: 1024},
		{in: "1Gi", want: 1 << 30},
		{in: "500M", want: 500_000_000},
		{in: "1e3", want: 1000},
		{in: " 2Ki ", want: 2048},
		{in: "1.5", r: Floor, want: 1},
		{in: "1.5", r: Ceil, want: 2},
		{in: "1500m", r: Ceil, want: 2},
		{in: "0.5", r: Ceil, want: 1},
		{in: "0.5", r: Floor, wantErr: "capacity values must be positive"},
		{in: "0", wantErr: "capacity values must be positive"},
		{in: int64(0), wantErr: "capacity values must be positive"},
		{in: int64(-5), wantErr: "capacity values must be positive"},
		{in: "-1Gi", wantErr: "capacity values must be positive"},
		{in: "abc", wantErr: `"abc" is not a quantity`},
		{in: 1.5, wantErr: "whole number of bytes"},
		{in: true, wantErr: "got boolean"},
		{in: []any{1}, wantErr: "got list"},
		{in: nil, wantErr: "must be set"},
		{in: "100Ei", wantErr: "too large"},
		{in: "9e999", wantErr: "too large"},
		{in: "9e999999", wantErr: "exponent out of range"},
		{in: "1e-999999999", wantErr: "exponent out of range"},
		{in: "1e-00009999", wantErr: "exponent out of range"},
		{in: "9223372036854775806", want: 9223372036854775806},
		{in: "1e-999", r: Ceil, want: 1},
		{in: "1e-999", r: Floor, wantErr: "must be positive"},
		{in: "0.000001", r: Ceil, want: 1},
	} {
		got, err := ParseCapacity(tc.in, tc.r)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseCapacity(%#v) error = %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseCapacity(%#v) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

// What a capacity pod reports: bytes or a quantity, 0 allowed (full), never
// negative, rounded down.
func TestParseFreeBytes(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    int64
		wantErr string
	}{
		{in: "0", want: 0},
		{in: "0\n", want: 0},
		{in: " 1073741824\n", want: 1 << 30},
		{in: "1Gi", want: 1 << 30},
		{in: "2.5Ki", want: 2560},
		{in: "0.5", want: 0},
		{in: "1.9", want: 1},
		{in: "", wantErr: "is empty"},
		{in: " \n", wantErr: "is empty"},
		{in: "-1", wantErr: "must not be negative"},
		{in: "-0.5", wantErr: "must not be negative"},
		{in: "12 GB", wantErr: "is not a quantity"},
		{in: "free: 12", wantErr: "is not a quantity"},
		{in: "100Ei", wantErr: "too large"},
		{in: "-100Ei", wantErr: "must not be negative"},
		{in: "1e-99999", wantErr: "exponent out of range"},
	} {
		got, err := ParseFreeBytes(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseFreeBytes(%q) error = %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseFreeBytes(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func FuzzParseCapacity(f *testing.F) {
	for _, s := range []string{"1Gi", "1.5", "0.5", "-1", "1e3", "9223372036854775807", "1e100"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		lo, errLo := ParseCapacity(s, Floor)
		hi, errHi := ParseCapacity(s, Ceil)
		if errLo == nil && lo < 1 || errHi == nil && hi < 1 {
			t.Fatalf("%q: non-positive result %d/%d", s, lo, hi)
		}
		if errLo == nil && errHi == nil && (hi < lo || hi-lo > 1) {
			t.Fatalf("%q: floor %d and ceil %d disagree", s, lo, hi)
		}
	})
}
