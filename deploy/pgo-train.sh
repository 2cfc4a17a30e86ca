#!/usr/bin/env bash
# Run the training load of a profile-guided build (deploy/build-image.sh with GATEWAY_IMAGE_PGO=1)
# against a three-node cluster of GATEWAY_BIN on loopback, and stop the nodes with SIGTERM, so
# that an instrumented build writes its profile as each node exits.
#
#   deploy/pgo-train.sh GATEWAY_BIN OUT_DIR
#
# GATEWAY_BIN: the gateway to train (built with -Cprofile-generate; any build works, which is how
# the tests check this script). OUT_DIR: created, and refused when it exists and is not empty; it
# holds the nodes' data, logs and, for an instrumented build, one .profraw per node process in
# OUT_DIR/profile (LLVM_PROFILE_FILE). The load, all on 127.0.0.1 ephemeral ports: for
# PGO_TRAIN_SECS (default 30), backend requests over keep-alive HTTP (claims, publishes, route
# lookups: deploy/pgo-load.py) and, beside them, rounds of PGO_TRAIN_DEVICES devices (default
# 1500) that connect, hold with pings and leave, new ones and then the same ones again (`gateway
# bench steady`), until the HTTP load ends. Every other run of the binary (probes, join, status,
# the device loader) profiles into OUT_DIR/loader-profile, which is not used. The nodes start with
# no GATEWAY_* setting of the caller's environment. Exits non-zero, naming the step, when the
# cluster does not form, a device round does not connect all of its devices, the HTTP load is
# refused, or a node does not exit 0 within 60 s of SIGTERM (it is then killed); on the way out it
# sends SIGTERM to the nodes and the HTTP load it started (the nodes drain and exit in seconds).
set -euo pipefail

say() { echo "pgo-train: $*" >&2; }
die() { echo "pgo-train: error: $*" >&2; exit 1; }

[[ $# -eq 2 ]] || die "usage: deploy/pgo-train.sh GATEWAY_BIN OUT_DIR"
[[ -f "$1" && -x "$1" ]] || die "no executable at $1"
BIN="$(realpath "$1")"
if [[ -e "$2" ]] && [[ ! -d "$2" || -n "$(ls -A "$2")" ]]; then
  die "$2 exists and is not an empty directory"
fi
mkdir -p "$2/profile" "$2/loader-profile"
OUT="$(realpath "$2")"
cd "$(dirname "$0")/.."
command -v python3 >/dev/null 2>&1 || die "python3 is needed for the HTTP load (deploy/pgo-load.py)"
SECS="${PGO_TRAIN_SECS:-30}"
[[ "$SECS" =~ ^[1-9][0-9]*$ ]] || die "PGO_TRAIN_SECS must be a whole number of seconds, got '$SECS'"
DEVICES="${PGO_TRAIN_DEVICES:-1500}"
[[ "$DEVICES" =~ ^[1-9][0-9]*$ ]] || die "PGO_TRAIN_DEVICES must be a whole number, got '$DEVICES'"
# The loader holds a socket a device and each node one or more a connection: raise the soft limit.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
(( $(ulimit -n) >= DEVICES + 1024 )) \
  || die "the open-files limit $(ulimit -n) is below the $((DEVICES + 1024)) a round of $DEVICES devices needs (ulimit -n)"
for v in $(compgen -e | grep '^GATEWAY_' || true); do unset "$v"; done

umask 077
head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$OUT/cluster.secret"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$OUT/device.secret"
export LLVM_PROFILE_FILE="$OUT/loader-profile/%m.profraw"

# Six ports held at once, so no two are the same; each node binds its pair a moment later.
ports="$(python3 -c '
import socket
s = [socket.socket() for _ in range(6)]
for x in s: x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))')" || die "picking six free loopback ports failed"
read -r -a PORTS <<< "$ports"

PIDS=() HTTP=""
stop_all() {
  local pid
  for pid in "${PIDS[@]}" $HTTP; do kill -TERM "$pid" 2>/dev/null || true; done
}
trap 'stop_all' EXIT

tail_of() { tail -n 20 "$OUT/$1.log" 2>/dev/null | sed 's/^/  /' >&2 || true; }

wait_for() { # what seconds command...
  local what=$1 secs=$2; shift 2
  local deadline=$((SECONDS + secs)) k
  until "$@" >/dev/null 2>&1; do
    for k in "${!PIDS[@]}"; do
      kill -0 "${PIDS[$k]}" 2>/dev/null || { tail_of "n$((k + 1))"; die "n$((k + 1)) exited while waiting: $what"; }
    done
    (( SECONDS < deadline )) || die "$what within ${secs}s (logs in $OUT)"
    sleep 0.2
  done
}

for k in 0 1 2; do
  name="n$((k + 1))" public=${PORTS[$((2 * k))]} cluster=${PORTS[$((2 * k + 1))]} mode=()
  (( k > 0 )) && mode=(--standby)
  mkdir -p "$OUT/$name"
  LLVM_PROFILE_FILE="$OUT/profile/$name-%p-%m.profraw" "$BIN" serve --name "$name" \
    --listen "127.0.0.1:$public" --cluster-listen "127.0.0.1:$cluster" --public-url "ws://127.0.0.1:$public" \
    --data-dir "$OUT/$name" --cluster-secret-file "$OUT/cluster.secret" \
    --device-secret-file "$OUT/device.secret" "${mode[@]}" >"$OUT/$name.log" 2>&1 &
  PIDS+=($!)
  wait_for "$name answering /healthz" 60 "$BIN" probe "http://127.0.0.1:$cluster/healthz"
done

C=("--cluster-secret-file" "$OUT/cluster.secret")
for k in 1 2; do
  "$BIN" join --cluster "127.0.0.1:${PORTS[1]}" --node "127.0.0.1:${PORTS[$((2 * k + 1))]}" "${C[@]}" >/dev/null \
    || die "joining n$((k + 1)) failed"
done
all_live() {
  [[ $("$BIN" status --json --cluster "127.0.0.1:${PORTS[1]}" "${C[@]}" | grep -o '"state":"live"' | wc -l) == 3 ]]
}
wait_for "the three members all live" 60 all_live
say "three nodes live (devices on 127.0.0.1:${PORTS[0]},${PORTS[2]},${PORTS[4]}); training for ${SECS}s"

python3 -B deploy/pgo-load.py --secret-file "$OUT/cluster.secret" --secs "$SECS" --threads 16 \
  "127.0.0.1:${PORTS[1]}" "127.0.0.1:${PORTS[3]}" "127.0.0.1:${PORTS[5]}" > "$OUT/http-load.json" &
HTTP=$!
nodes="ws://127.0.0.1:${PORTS[0]},ws://127.0.0.1:${PORTS[2]},ws://127.0.0.1:${PORTS[4]}"
hold=$(( SECS / 10 > 1 ? SECS / 10 : 1 ))
rounds=0
# Rounds until the HTTP load ends (at least one): new devices, then the same devices again.
while (( rounds == 0 )) || kill -0 "$HTTP" 2>/dev/null; do
  rounds=$((rounds + 1))
  for again in "" "-again"; do
    report="$OUT/steady-$rounds$again.json"
    "$BIN" bench steady --nodes "$nodes" --cluster "127.0.0.1:${PORTS[1]}" --devices "$DEVICES" --secs "$hold" \
      --prefix "train$rounds" --device-secret-file "$OUT/device.secret" "${C[@]}" --json \
      > "$report" 2>>"$OUT/steady.log" || die "device round $rounds$again failed (see $OUT/steady.log)"
    grep -q "\"connected\":$DEVICES," "$report" \
      || die "device round $rounds$again did not connect all $DEVICES devices (report: $report)"
  done
done
wait "$HTTP" || die "the HTTP load failed (see $OUT/http-load.json)"
HTTP=""
say "devices: $rounds round(s) of $DEVICES new and returning; HTTP: $(cat "$OUT/http-load.json")"

for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
deadline=$((SECONDS + 60))
for k in 0 1 2; do
  while kill -0 "${PIDS[$k]}" 2>/dev/null && (( SECONDS < deadline )); do sleep 0.2; done
  if kill -0 "${PIDS[$k]}" 2>/dev/null; then
    for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    die "n$((k + 1)) did not exit within 60 s of SIGTERM; killed (log: $OUT/n$((k + 1)).log)"
  fi
  rc=0
  wait "${PIDS[$k]}" || rc=$?
  (( rc == 0 )) || die "n$((k + 1)) exited $rc on SIGTERM (log: $OUT/n$((k + 1)).log)"
done
trap - EXIT
say "stopped; profiles written: $(find "$OUT/profile" -name '*.profraw' | wc -l)"
