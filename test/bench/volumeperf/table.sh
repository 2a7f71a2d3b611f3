#!/usr/bin/env bash
# table.sh REPORT.json — the figures of Kubernetes' volume performance testsuite
# (volume-lifecycle-performance) from a Ginkgo JSON report of make bench-volumeperf, one line per
# driver, as a Markdown table: claims, average latency (creation → Bound), throughput (claims /
# the last one's latency), the limits it was held to, the verdict, and how long the spec ran
# (its cleanup, which deletes the claims one at a time, included). Drivers the suite skipped (its
# own in-tree list) are left out. It exits 1 when a driver that is not a peer (PEER_DRIVERS,
# default csi-driver-host-path's) did not pass, or when none ran: a peer held to its own limits
# is reported, not a failure of pav's.
set -euo pipefail
peers=" ${PEER_DRIVERS:-hostpath.csi.k8s.io} "
report="${1:?usage: $0 REPORT.json}"
echo "| driver | claims | average latency | throughput | limits | | spec run time (cleanup included) |"
echo "|---|---:|---:|---:|---|---|---:|"
rc=0 ours=0
while IFS=$'\t' read -r driver state runtime out; do
  text="$(base64 -d <<<"$out")"
  metrics="$(sed -n '/Metrics to evaluate/,/^})/p' <<<"$text")"
  lat="$(sed -n 's/.*AvgLatency: (time.Duration) \([0-9]*\).*/\1/p' <<<"$metrics" | head -n1)"
  thr="$(sed -n 's/.*Throughput: (float64) \([0-9.e+-]*\).*/\1/p' <<<"$metrics" | head -n1)"
  count="$(sed -n 's/.*Creating \([0-9]*\) PVCs.*/\1/p' <<<"$text" | head -n1)"
  limits="$(sed -n '/against baseline/,/^})/p' <<<"$text")"
  llat="$(sed -n 's/.*AvgLatency: (time.Duration) \([0-9]*\).*/\1/p' <<<"$limits" | head -n1)"
  lthr="$(sed -n 's/.*Throughput: (float64) \([0-9.e+-]*\).*/\1/p' <<<"$limits" | head -n1)"
  verdict=PASS; [ "$state" = passed ] || verdict="$state"
  case "$peers" in
  *" $driver "*) verdict="$verdict (peer)" ;;
  *) ours=$((ours + 1)); [ "$state" = passed ] || rc=1 ;;
  esac
  awk -v d="$driver" -v n="${count:-?}" -v lat="$lat" -v thr="$thr" -v llat="$llat" -v lthr="$lthr" -v v="$verdict" -v rt="$runtime" 'BEGIN {
    l = (lat == "") ? "—" : sprintf("%.1f s", lat / 1e9)
    t = (thr == "") ? "—" : sprintf("%.2f claims/s", thr)
    lim = (llat == "") ? "—" : sprintf("≤ %.0f s, ≥ %s claims/s", llat / 1e9, lthr)
    printf "| %s | %s | %s | %s | %s | %s | %.0f s |\n", d, n, l, t, lim, v, rt
  }'
done < <(jq -r '.[].SpecReports[]? | select((.LeafNodeText // "") | test("provision volumes at scale within performance constraints"))
  | select(.State != "skipped")
  | [ ((.ContainerHierarchyTexts // []) | join(" ") | capture("\\[Driver: (?<d>[^\\]]+)\\]").d // "?"),
      .State, ((.RunTime // 0) / 1e9 | tostring),
      (((.SpecEvents // []) | map(.Message // "") | join("\n")) + "\n" + (.CapturedGinkgoWriterOutput // "")
        + (.CapturedStdOutErr // "") + "\n" + (.Failure.Message // "") | @base64) ] | @tsv' "$report")
if [ "$ours" -eq 0 ]; then
  echo "table.sh: no result of a pav driver in $report" >&2
  exit 1
fi
exit "$rc"
