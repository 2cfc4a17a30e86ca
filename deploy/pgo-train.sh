#!/usr/bin/env bash
# Run the training load of a profile-guided build (deploy/build-image.sh with GATEWAY_IMAGE_PGO=1)
# against a three-node cluster of GATEWAY_BIN on loopback, and stop the nodes with SIGTERM, so
# that an instrumented build writes its profile as each node exits.
#
#   deploy/pgo-train.sh GATEWAY_BIN OUT_DIR
#
# GATEWAY_BIN: the gateway to train (built with -Cprofile-generate; any build works, which is how
# the tests check this script). OUT_DIR: created; holds the nodes' data, logs and, for an
# instrumented build, one .profraw per node process (LLVM_PROFILE_FILE is set to OUT_DIR/profile).
# The load, all on 127.0.0.1 ephemeral ports: devices connecting, holding with pings and leaving
# (`gateway bench steady`, new devices and the same devices again), and at the same time backend
# requests over keep-alive HTTP (claims, publishes, route lookups: deploy/pgo-load.py). The
# loader's own runs write no profile into OUT_DIR/profile. Exits non-zero, naming the step, when
# the cluster does not form, a load step fails or a node does not stop cleanly on SIGTERM.
# PGO_TRAIN_SECS (default 30) is the HTTP load's length; the device rounds scale with it.
# PGO_TRAIN_DEVICES (default 1500) is the devices of each round.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "pgo-train: $*" >&2; }
die() { echo "pgo-train: error: $*" >&2; exit 1; }

[[ $# -eq 2 ]] || die "usage: deploy/pgo-train.sh GATEWAY_BIN OUT_DIR"
[[ -f "$1" && -x "$1" ]] || die "no executable at $1"
BIN="$(realpath "$1")" OUT="$2"
command -v python3 >/dev/null 2>&1 || die "python3 is needed for the HTTP load (deploy/pgo-load.py)"
SECS="${PGO_TRAIN_SECS:-30}"
[[ "$SECS" =~ ^[1-9][0-9]*$ ]] || die "PGO_TRAIN_SECS must be a whole number of seconds, got '$SECS'"
DEVICES="${PGO_TRAIN_DEVICES:-1500}"
[[ "$DEVICES" =~ ^[1-9][0-9]*$ ]] || die "PGO_TRAIN_DEVICES must be a whole number, got '$DEVICES'"

mkdir -p "$OUT/profile" "$OUT/loader-profile"
OUT="$(realpath "$OUT")"
umask 077
head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$OUT/cluster.secret"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$OUT/device.secret"

# Six ports held at once, so no two are the same; a node binds its pair a moment later.
read -r -a PORTS <<< "$(python3 -c '
import socket
s = [socket.socket() for _ in range(6)]
for x in s: x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))')"

# Every run of the binary but the three nodes (probes, join, status, the device loader) profiles
# into loader-profile, which is not used.
export LLVM_PROFILE_FILE="$OUT/loader-profile/%p-%m.profraw"
PIDS=()
stop_all() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
}
trap 'stop_all' EXIT

wait_for() { # what seconds command...
  local what=$1 secs=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
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
  wait_for "$name did not answer /healthz" 60 "$BIN" probe "http://127.0.0.1:$cluster/healthz"
done

C=("--cluster-secret-file" "$OUT/cluster.secret")
for k in 1 2; do
  "$BIN" join --cluster "127.0.0.1:${PORTS[1]}" --node "127.0.0.1:${PORTS[$((2 * k + 1))]}" "${C[@]}" >/dev/null \
    || die "joining n$((k + 1)) failed"
done
all_live() {
  [[ $("$BIN" status --json --cluster "127.0.0.1:${PORTS[1]}" "${C[@]}" | grep -o '"state":"live"' | wc -l) == 3 ]]
}
wait_for "the three members were not all live" 60 all_live
say "three nodes live (devices on 127.0.0.1:${PORTS[0]},${PORTS[2]},${PORTS[4]}); training for ${SECS}s"

python3 -B deploy/pgo-load.py --secret-file "$OUT/cluster.secret" --secs "$SECS" --threads 16 \
  "127.0.0.1:${PORTS[1]}" "127.0.0.1:${PORTS[3]}" "127.0.0.1:${PORTS[5]}" > "$OUT/http-load.json" &
http=$!
nodes="ws://127.0.0.1:${PORTS[0]},ws://127.0.0.1:${PORTS[2]},ws://127.0.0.1:${PORTS[4]}"
hold=$(( SECS / 6 > 1 ? SECS / 6 : 1 ))
rounds=$(( SECS / (3 * hold + 4) > 1 ? SECS / (3 * hold + 4) : 1 ))
for r in $(seq 1 "$rounds"); do
  for again in "" "-again"; do
    "$BIN" bench steady --nodes "$nodes" --cluster "127.0.0.1:${PORTS[1]}" --devices "$DEVICES" --secs "$hold" \
      --prefix "train$r" --device-secret-file "$OUT/device.secret" "${C[@]}" --json \
      > "$OUT/steady-$r$again.json" 2>>"$OUT/steady.log" || die "device round $r$again failed (see $OUT/steady.log)"
  done
done
wait "$http" || die "the HTTP load failed (see $OUT/http-load.json)"
say "devices: $rounds round(s) of $DEVICES new and returning; HTTP: $(cat "$OUT/http-load.json")"

trap - EXIT
for pid in "${PIDS[@]}"; do kill -TERM "$pid"; done
for k in 0 1 2; do
  rc=0
  wait "${PIDS[$k]}" || rc=$?
  (( rc == 0 )) || die "n$((k + 1)) exited $rc on SIGTERM (log: $OUT/n$((k + 1)).log)"
done
say "stopped; profiles written: $(find "$OUT/profile" -name '*.profraw' | wc -l)"
