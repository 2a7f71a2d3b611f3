#!/usr/bin/env bash
# go-test.sh ARGS...: runs `go test ARGS...` with its output streamed as usual and
# saved in $GO_TEST_LOG (default _output/go-test.log); when it fails, it ends with a
# summary of what failed: each failing test with the lines it logged, every panic
# and data race, and the failing packages.
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
	grep -n -E -A 25 -- '^\s*--- FAIL|^panic:|WARNING: DATA RACE|^fatal error:|cannot find package|\[build failed\]|\[setup failed\]' "$log" | head -300
	echo "---- failing packages:"
	grep -E '^FAIL\s' "$log" || echo "(none named: see above)"
fi
exit "$rc"
