#!/usr/bin/env bash
# Time a serial scale-in against N / drain rate (issue 15): for each "DEVICES RATE" pair, start a
# fresh three-node loopback cluster (deploy/local-cluster.sh) with --drain-rate RATE, hold DEVICES
# devices on it with `gateway bench steady` (placement spreads them, so n3 holds about a third),
# run `gateway scale-in --node n3`, and print n3's connections at the lock (N), the measured time
# and N / RATE.
#
#   deploy/scale-in-figures.sh "300 50" "600 50" "600 100"
#
# Uses GATEWAY_BIN (default target/release/gateway); ports 7001-7003 and 8001-8003 must be free.
set -euo pipefail

BIN="${GATEWAY_BIN:-target/release/gateway}"
HERE="$(cd "$(dirname "$0")" && pwd)"
[[ $# -gt 0 ]] || set -- "300 50" "600 50" "600 100"

printf '%-8s %-6s %-10s %-10s %-10s\n' DEVICES RATE "N ON N3" "TOOK S" "N/RATE S"
for pair in "$@"; do
  read -r devices rate <<<"$pair"
  dir="$(mktemp -d)"
  export LOCAL_CLUSTER_DIR="$dir" GATEWAY_BIN="$BIN" GATEWAY_DRAIN_RATE="$rate"
  "$HERE/local-cluster.sh" start >"$dir/start.log" 2>&1
  secret="$dir/cluster.secret"
  "$BIN" bench steady --nodes ws://127.0.0.1:8001,ws://127.0.0.1:8002,ws://127.0.0.1:8003 \
    --devices "$devices" --secs 600 --device-secret-file "$dir/device.secret" \
    --cluster-secret-file "$secret" >"$dir/bench.log" 2>&1 &
  bench=$!
  # Wait until the cluster holds every device (renewed counts, every lease/5).
  for _ in $(seq 1 600); do
    held=$("$BIN" status --json --cluster 127.0.0.1:7001 --cluster-secret-file "$secret" |
      python3 -c 'import json,sys; print(sum(m["connections"] for m in json.load(sys.stdin)["members"]))')
    (( held >= devices )) && break
    sleep 0.2
  done
  out="$("$BIN" scale-in --cluster 127.0.0.1:7001 --node n3 --cluster-secret-file "$secret")"
  echo "$out" >"$dir/scale-in.log"
  n=$(sed -n 's/.*removing n3 (id [0-9]*, \([0-9]*\) connections.*/\1/p' <<<"$out")
  took=$(sed -n 's/^done: n3 removed in \([0-9.]*\) s/\1/p' <<<"$out")
  printf '%-8s %-6s %-10s %-10s %-10s\n' "$devices" "$rate" "$n" "$took" "$(python3 -c "print(round($n/$rate, 2))")"
  kill "$bench" 2>/dev/null || true
  wait "$bench" 2>/dev/null || true
  "$HERE/local-cluster.sh" stop >/dev/null 2>&1 || true
  rm -rf "$dir"
done
