// Package procstat reads a process's memory, and the machine's and its
// processes' CPU time (cpu.go), from /proc for pav's benchmarks (test/bench,
// test/scale), which measure pav's processes on the machine of the local
// cluster.
package procstat

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Status reads a "kB" field of /proc/PID/status (VmRSS, RssAnon, VmHWM, …)
// in bytes; 0 if the process or the field is not there.
func Status(pid int, key string) int64 {
	return kbField(fmt.Sprintf("/proc/%d/status", pid), key)
}

// Rollup reads a "kB" field of /proc/PID/smaps_rollup (Pss, Pss_Anon,
// Pss_File, …) in bytes; 0 if the process or the field is not there. PSS
// counts each page shared with other processes divided by how many map it:
// the pages of pav's binary, mapped by every pav process of a node, weigh in
// RSS whole in each of them.
func Rollup(pid int, key string) int64 {
	return kbField(fmt.Sprintf("/proc/%d/smaps_rollup", pid), key)
}

// kbField reads the field key ("Key:   123 kB") of a /proc file, in bytes.
func kbField(path, key string) int64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb * 1024
		}
	}
	return 0
}

// Every calls sample now and then every period, on its own goroutine, until
// the returned stop is called; stop waits for a running sample to end and may
// be called more than once. The benchmarks sample RSS with it: the peak of a
// phase, which VmHWM (the peak since the process started) cannot tell.
func Every(period time.Duration, sample func()) (stop func()) {
	done := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			sample()
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	})
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

// Peak is the highest RSS of a process that Observe has seen; safe for
// concurrent use (Every samples on its own goroutine).
type Peak struct {
	mu  sync.Mutex
	max int64
}

// Observe reads pid's RSS (VmRSS) and keeps it if it is the highest yet.
func (p *Peak) Observe(pid int) {
	r := Status(pid, "VmRSS")
	p.mu.Lock()
	p.max = max(p.max, r)
	p.mu.Unlock()
}

// Max is the highest RSS observed, in bytes; 0 before any.
func (p *Peak) Max() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.max
}
