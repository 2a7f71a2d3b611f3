// Package procstat reads a process's memory from /proc for pav's benchmarks
// (test/bench, test/scale), which measure pav's processes on the single node
// of the local cluster.
package procstat

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Status reads a "kB" field of /proc/PID/status (VmRSS, RssAnon, VmHWM, …)
// in bytes; 0 if the process or the field is not there.
func Status(pid int, key string) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
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
