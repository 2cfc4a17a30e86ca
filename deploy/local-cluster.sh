#!/usr/bin/env bash
# Start (or stop) a three-node gateway cluster on loopback, for trying things out by hand.
#
#   deploy/local-cluster.sh          start n1 (bootstrap), n2 and n3 (standby), join them, print status
#   deploy/local-cluster.sh stop     stop the nodes started by this script
#
# Builds nothing: set GATEWAY_BIN or run `cargo build --release` first (target/release/gateway).
# State lives in ./local-cluster/ (override with LOCAL_CLUSTER_DIR): one data dir per node, one shared
# cluster secret and one device secret (mode 0600), node logs, and a PIDs file.
set -euo pipefail

DIR="${LOCAL_CLUSTER_DIR:-./local-cluster}"
BIN="${GATEWAY_BIN:-target/release/gateway}"
PIDS="$DIR/pids"
NODES=(n1 n2 n3)
CLUSTER_PORTS=(7001 7002 7003)
PUBLIC_PORTS=(8001 8002 8003)
HEALTH_TIMEOUT_S="${HEALTH_TIMEOUT_S:-30}"

die() { echo "local-cluster: $*" >&2; exit 1; }

stop() {
  [[ -f "$PIDS" ]] || { echo "no $PIDS: nothing to stop"; return 0; }
  while read -r name pid; do
    [[ -n "${pid:-}" ]] || continue
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" && echo "stopping $name (pid $pid)"
    fi
  done < "$PIDS"
  # Give each node its drain; then make sure.
  for _ in $(seq 1 100); do
    alive=0
    while read -r _name pid; do kill -0 "$pid" 2>/dev/null && alive=1; done < "$PIDS"
    [[ $alive == 0 ]] && break
    sleep 0.1
  done
  while read -r name pid; do
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" && echo "killed $name (pid $pid)"; fi
  done < "$PIDS"
  rm -f "$PIDS"
  echo "stopped; data kept in $DIR (rm -rf it for a fresh cluster)"
}

wait_healthy() { # name port
  local name=$1 port=$2 deadline=$((SECONDS + HEALTH_TIMEOUT_S))
  until curl -fsS -o /dev/null "http://127.0.0.1:$port/healthz" 2>/dev/null; do
    if (( SECONDS >= deadline )); then
      tail -n 30 "$DIR/$name.log" >&2 || true
      die "$name did not answer /healthz on 127.0.0.1:$port within ${HEALTH_TIMEOUT_S}s (log: $DIR/$name.log)"
    fi
    sleep 0.2
  done
  echo "$name healthy on 127.0.0.1:$port"
}

start() {
  [[ -x "$BIN" ]] || die "no executable at $BIN: set GATEWAY_BIN or run 'cargo build --release'"
  command -v curl >/dev/null || die "curl is needed for the health checks"
  if [[ -f "$PIDS" ]]; then
    while read -r name pid; do
      kill -0 "$pid" 2>/dev/null && die "$name is already running (pid $pid); run '$0 stop' first"
    done < "$PIDS"
    rm -f "$PIDS"
  fi
  mkdir -p "$DIR"
  umask 077
  local secret="$DIR/cluster.secret" device_secret="$DIR/device.secret"
  [[ -f "$secret" ]] || head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$secret"
  [[ -f "$device_secret" ]] || head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$device_secret"
  chmod 600 "$secret" "$device_secret"

  for k in 0 1 2; do
    local name=${NODES[$k]} mode=()
    mkdir -p "$DIR/$name"
    (( k > 0 )) && mode=(--standby)   # ignored by a node that already has state
    "$BIN" serve --name "$name" \
      --listen "127.0.0.1:${PUBLIC_PORTS[$k]}" --cluster-listen "127.0.0.1:${CLUSTER_PORTS[$k]}" \
      --public-url "ws://127.0.0.1:${PUBLIC_PORTS[$k]}" \
      --data-dir "$DIR/$name" --cluster-secret-file "$secret" --device-secret-file "$device_secret" \
      "${mode[@]}" 2>>"$DIR/$name.log" >>"$DIR/$name.log" &
    echo "$name $!" >> "$PIDS"
    wait_healthy "$name" "${CLUSTER_PORTS[$k]}"
  done

  # On a restart the nodes resume their membership and joining a member again is a no-op.
  for k in 1 2; do
    "$BIN" join --cluster "127.0.0.1:${CLUSTER_PORTS[0]}" --node "127.0.0.1:${CLUSTER_PORTS[$k]}" \
      --cluster-secret-file "$secret"
  done
  # Wait until every member holds a live lease (its first renewal committed) and the ring has all three.
  local deadline=$((SECONDS + HEALTH_TIMEOUT_S)) live=0
  until (( live == 3 )); do
    live=$("$BIN" status --json --cluster "127.0.0.1:${CLUSTER_PORTS[0]}" --cluster-secret-file "$secret" \
      | grep -o '"state":"live"' | wc -l) || live=0
    (( live == 3 )) && break
    (( SECONDS >= deadline )) && die "members not all live within ${HEALTH_TIMEOUT_S}s (logs in $DIR)"
    sleep 0.2
  done
  "$BIN" status --cluster "127.0.0.1:${CLUSTER_PORTS[0]}" --cluster-secret-file "$secret"

  cat <<MSG

cluster running: cluster listeners 127.0.0.1:7001-7003, device (WebSocket) listeners 127.0.0.1:8001-8003
  secret:  $secret (Authorization: Bearer \$(cat $secret))
  logs:    $DIR/n{1,2,3}.log
  PIDs:    $PIDS
  status:  $BIN status --cluster 127.0.0.1:7001 --cluster-secret-file $secret
  stop:    $0 stop
MSG
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 [start|stop]" >&2; exit 64 ;;
esac
