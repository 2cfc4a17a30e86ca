#!/usr/bin/env bash
# The fleet run of issue 11 (opt-in; not part of `cargo test`, ~15 minutes at full scale): four
# real gateway processes on free 127.0.0.1 ports hold FLEET_DEVICES devices (default 57,000) of
# `gateway bench` loaders for FLEET_HOLD_SECS (default 600) while it checks that every device stays
# connected and answers the nodes' pings; then it SIGKILLs the node holding the most devices and
# measures their re-homing against `gateway plan-storm`, and that no other device was disturbed.
# It kills every process it started and removes its temp dir however it ends (Ctrl-C included),
# and exits 1 with a `fleet: FAIL ...` line naming the check that failed.
#
#   tests/fleet/run.sh                                   # 57,000 devices, 10 minutes
#   FLEET_DEVICES=4000 FLEET_HOLD_SECS=20 tests/fleet/run.sh   # a quick check (about a minute)
#
# Builds nothing: GATEWAY_BIN (default target/release/gateway; build it with
# `cargo build --release`). The other knobs (FLEET_NODES, FLEET_LOADERS, FLEET_RAMP, ...) are
# described at the top of tests/fleet/fleet.py. Needs python3 (standard library) and ss (iproute2).
set -euo pipefail
cd "$(dirname "$0")/../.."

command -v python3 >/dev/null 2>&1 || { echo "fleet: python3 is not installed" >&2; exit 1; }
command -v ss >/dev/null 2>&1 || { echo "fleet: ss (iproute2) is not installed" >&2; exit 1; }
# One socket per device in every node and loader: take the whole hard limit of open files.
ulimit -n "$(ulimit -Hn)"
exec python3 -u -B tests/fleet/fleet.py "$@"
