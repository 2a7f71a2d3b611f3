package phase

import (
	"fmt"
	"math"
	"math/big"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Rounding says how a capacity with a fractional byte count becomes whole bytes.
// A minimum is rounded down and a maximum up, so that rounding never rejects a
// request the user's own numbers allow; a created volume's capacity is rounded
// down so pav never promises a byte the volume does not have.
type Rounding int

const (
	Floor Rounding = iota
	Ceil
)

// ParseCapacity turns a capacity value — an integer, or a Kubernetes quantity string
// such as "1Gi", "500M" or "1e3" — into a positive number of bytes.
func ParseCapacity(v any, r Rounding) (int64, error) {
	switch x := v.(type) {
	case int64:
		return positive(x)
	case int:
		return positive(int64(x))
	case float64:
		if x != math.Trunc(x) || math.IsInf(x, 0) || math.Abs(x) > math.MaxInt64 {
			return 0, fmt.Errorf("must be a whole number of bytes or a quantity string such as \"1Gi\", got %v", x)
		}
		return positive(int64(x))
	case string:
		return parseQuantity(x, r)
	case nil:
		return 0, fmt.Errorf("must be set")
	default:
		return 0, fmt.Errorf("must be an integer or a quantity string such as \"1Gi\", got %s", typeName(v))
	}
}

// hugeExponent matches decimal exponents of four digits or more: no capacity
// needs one, and resource.ParseQuantity takes seconds to minutes on
// "1e-9999999" (found by FuzzParseCapacity), so they are refused before it runs.
var hugeExponent = regexp.MustCompile(`[eE][+-]?0*[0-9]{4,}`)

// ParseFreeBytes reads what a pod reports of free space (/pav/capacity and
// /pav/maximumVolumeSize of the capacity pod): a whole number of bytes or a
// quantity such as "1Gi", rounded down (never a byte more than the pod
// said), and, unlike a volume's capacity, 0 is allowed: the segment is full.
func ParseFreeBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, fmt.Errorf("is empty: write a number of bytes or a quantity such as 1Gi (0 when full)")
	}
	n, err := quantityBytes(s, Floor)
	if err != nil {
		return 0, err
	}
	if n < 0 {
		return 0, fmt.Errorf("must not be negative, got %q (write 0 when full)", s)
	}
	return n, nil
}

func parseQuantity(s string, r Rounding) (int64, error) {
	n, err := quantityBytes(s, r)
	if err != nil {
		return 0, err
	}
	return positive(n)
}

// quantityBytes is a quantity string as whole bytes, rounded as r says, of
// any sign.
func quantityBytes(s string, r Rounding) (int64, error) {
	if hugeExponent.MatchString(s) {
		return 0, fmt.Errorf("%q has an exponent out of range (use bytes or a suffix: 1Gi, 500M, 1e3)", s)
	}
	q, err := resource.ParseQuantity(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("%q is not a quantity (use bytes or a suffix: 1Gi, 500M, 1e3)", s)
	}
	// AsDec is exact: quantities such as "1.5k" or "0.5" keep their fraction, and
	// the rounding direction matters at the edges of a capacity range.
	d := q.AsDec()
	unscaled, scale := d.UnscaledBig(), int64(d.Scale())
	digits := int64(len(new(big.Int).Abs(unscaled).String()))
	var bytes *big.Int
	switch {
	case unscaled.Sign() == 0:
		bytes = new(big.Int)
	case scale <= 0 && digits-scale > 19:
		// More than 19 digits cannot fit an int64; checked before computing
		// 10^-scale, which for "1e999999999" would take gigabytes.
		return 0, fmt.Errorf("%q is too large", s)
	case scale <= 0:
		bytes = new(big.Int).Mul(unscaled, new(big.Int).Exp(big.NewInt(10), big.NewInt(-scale), nil))
	case scale > digits:
		// |value| < 1: no need for 10^scale to round it.
		bytes = new(big.Int)
		if r == Ceil && unscaled.Sign() > 0 {
			bytes.SetInt64(1)
		}
		if r == Floor && unscaled.Sign() < 0 {
			bytes.SetInt64(-1)
		}
	default:
		div := new(big.Int).Exp(big.NewInt(10), big.NewInt(scale), nil)
		quo, rem := new(big.Int).QuoRem(unscaled, div, new(big.Int))
		if rem.Sign() != 0 && r == Ceil && unscaled.Sign() > 0 {
			quo.Add(quo, big.NewInt(1))
		}
		if rem.Sign() != 0 && r == Floor && unscaled.Sign() < 0 {
			quo.Sub(quo, big.NewInt(1))
		}
		bytes = quo
	}
	// ParseQuantity clamps what does not fit an int64 to MaxInt64.
	if !bytes.IsInt64() || bytes.Int64() == math.MaxInt64 || bytes.Int64() == math.MinInt64 {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return bytes.Int64(), nil
}

func positive(n int64) (int64, error) {
	if n < 1 {
		return 0, fmt.Errorf("capacity values must be positive, got %d bytes", n)
	}
	return n, nil
}

// FormatBytes prints a byte count the way users write it when it is exact
// (1Gi), else as plain bytes.
func FormatBytes(n int64) string {
	return resource.NewQuantity(n, resource.BinarySI).String()
}
