#!/usr/bin/env bash
# go-test.sh ARGS...: runs `go test ARGS...` with its output streamed as usual and
# saved in $GO_TEST_LOG (default _output/go-test.log); when it fails, it ends with a
# summary of what failed: each failing test with the lines it logged (wherever parallel
# tests interleaved them), every panic and data race, and the failing packages.
# CI shows only the tail of a run; without the summary that tail is some other
# package's logs, and the failure is lost among thousands of lines.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p _output
log=${GO_TEST_LOG:-_output/go-test.log}
"${GO:-go}" test "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
	echo
	echo "==== go test failed (exit $rc); what failed, from $log ===="
	# What each failing test logged: with -v, a test's lines come before its "--- FAIL"
	# line, under "=== RUN/CONT/NAME <test>" headers, interleaved with other tests'. The
	# events a failing e2e test dumps ("…: event …") come last, 10 at most: they would
	# otherwise push its own messages out of CI's tail.
	awk '
		/^=== (RUN|CONT|NAME|PAUSE) / { cur = $3; next }
		/^ *--- FAIL: / { if (!($3 in failed)) { failed[$3] = 1; order[++n] = $3 }; next }
		/^ *--- (PASS|SKIP): / || /^(PASS|FAIL|ok )/ { next }
		cur != "" && /: event / { ev[cur, ++nev[cur]] = $0; next }
		cur != "" { lines[cur, ++nl[cur]] = $0 }
		END {
			for (i = 1; i <= n; i++) {
				t = order[i]
				if (nl[t] == 0) continue
				print "---- " t " logged" (nl[t] > 40 ? " (its last 40 lines)" : "") ":"
				for (j = (nl[t] > 40 ? nl[t] - 39 : 1); j <= nl[t]; j++) print lines[t, j]
			}
			for (i = 1; i <= n; i++) {
				t = order[i]
				if (nev[t] == 0) continue
				print "---- " t ": " nev[t] " events dumped" (nev[t] > 10 ? ", the last 10" : "") ":"
				for (j = (nev[t] > 10 ? nev[t] - 9 : 1); j <= nev[t]; j++) print ev[t, j]
			}
		}' "$log" | head -300
	grep -n -E -A 25 -- '^panic:|WARNING: DATA RACE|^fatal error:|cannot find package|\[build failed\]|\[setup failed\]' "$log" | head -200
	echo "---- failing packages:"
	grep -E '^FAIL\s' "$log" || echo "(none named: see above)"
fi
exit "$rc"
