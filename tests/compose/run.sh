#!/usr/bin/env bash
# The compose suite (opt-in; .ci/run runs it when Docker works): builds the image with
# deploy/build-image.sh (cargo and docker reuse what is up to date; COMPOSE_SUITE_IMAGE=TAG uses an
# image as it is), starts deploy/compose.yaml as a project of its own on free 127.0.0.1 ports, and
# checks forming by service name, docker kill + restart, a partition of the leader, docker pause
# past the lease, and a rolling restart under a device fleet, printing what it measured.
# It removes its containers, network and volumes (docker-compose down -v) however it ends.
#
#   tests/compose/run.sh [--devices N] [--hold SECS] [--image TAG]
#
# Needs docker, docker-compose (1.29 or later), python3 (standard library only), and root for
# nsenter (to read a partitioned node's /readyz inside its network namespace; without it that one
# observation is replaced by the node's fence counter after the heal).
# Exits 0 and says why when Docker is not available.
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v docker >/dev/null 2>&1; then
  echo "compose suite: skipped: docker is not installed"
  exit 0
fi
if ! docker info >/dev/null 2>&1; then
  echo "compose suite: skipped: the Docker daemon is not reachable ('docker info' failed)"
  exit 0
fi
command -v docker-compose >/dev/null 2>&1 || { echo "compose suite: docker-compose is not installed" >&2; exit 1; }
command -v python3 >/dev/null 2>&1 || { echo "compose suite: python3 is not installed" >&2; exit 1; }

exec python3 -u -B tests/compose/suite.py "$@"
