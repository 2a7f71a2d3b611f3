package procstat

import (
	"os"
	"sync/atomic"
	"testing"
	"time"
)

func TestStatus(t *testing.T) {
	if rss := Status(os.Getpid(), "VmRSS"); rss <= 0 {
		t.Errorf("VmRSS of this process: %d", rss)
	}
	if v := Status(os.Getpid(), "NoSuchField"); v != 0 {
		t.Errorf("missing field: %d", v)
	}
	if v := Status(-1, "VmRSS"); v != 0 {
		t.Errorf("missing process: %d", v)
	}
	if pss, rss := Rollup(os.Getpid(), "Pss"), Rollup(os.Getpid(), "Rss"); pss <= 0 || pss > rss {
		t.Errorf("Pss %d, Rss %d of this process", pss, rss)
	}
}

// Every samples at once, keeps sampling until stopped, and never after stop
// returns, however often stop is called.
func TestEvery(t *testing.T) {
	var n atomic.Int32
	stop := Every(time.Millisecond, func() { n.Add(1) })
	for n.Load() < 3 {
		time.Sleep(time.Millisecond)
	}
	stop()
	stop()
	after := n.Load()
	time.Sleep(10 * time.Millisecond)
	if n.Load() != after {
		t.Errorf("sampled %d times after stop", n.Load()-after)
	}
}

// Peak keeps the highest of what it observed.
func TestPeak(t *testing.T) {
	var p Peak
	if p.Max() != 0 {
		t.Fatalf("Max before any observation: %d", p.Max())
	}
	p.Observe(os.Getpid())
	first := p.Max()
	if first <= 0 {
		t.Fatalf("Max %d after observing this process", first)
	}
	p.Observe(-1) // no such process: RSS 0, not a new peak
	if p.Max() != first {
		t.Errorf("Max %d after observing nothing, want %d", p.Max(), first)
	}
}
