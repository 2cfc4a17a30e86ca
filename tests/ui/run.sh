#!/usr/bin/env bash
# The status page in a real browser (opt-in; .ci/run runs it when Chromium starts): a three-node
# cluster of the gateway binary on free 127.0.0.1 ports, /ui screenshotted and its DOM dumped with
# headless Chromium before and after `kill -9` of a node; checks that the ring shows three nodes'
# arcs, then two, that the killed node's colour is gone from the picture, that its row says it is
# out of the ring, and that the page's own refresh reached /ui/live through Basic auth.
#
#   tests/ui/run.sh [--out DIR]        # screenshots and DOM dumps in DIR (default tests/ui/out)
#
# Needs python3 (standard library only) and Chromium (Debian package `chromium`); uses
# $GATEWAY_BIN or builds target/debug/gateway. Exits 0 and says why when Chromium cannot run.
set -euo pipefail
cd "$(dirname "$0")/../.."

CHROMIUM="${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}"
if [[ -z "$CHROMIUM" ]]; then
  echo "ui suite: skipped: chromium is not installed (apt-get install chromium)"
  exit 0
fi
probe_dir="$(mktemp -d)"
trap 'rm -rf "$probe_dir"' EXIT
if ! timeout 60 "$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-background-networking \
    --disable-component-update --disable-sync --user-data-dir="$probe_dir" --dump-dom about:blank \
    >/dev/null 2>&1; then
  echo "ui suite: skipped: $CHROMIUM does not start headless"
  exit 0
fi
command -v python3 >/dev/null 2>&1 || { echo "ui suite: python3 is not installed" >&2; exit 1; }
if [[ -z "${GATEWAY_BIN:-}" ]]; then
  cargo build --locked --quiet
  GATEWAY_BIN="${CARGO_TARGET_DIR:-target}/debug/gateway"
fi
export CHROMIUM GATEWAY_BIN
exec python3 -u -B tests/ui/screenshot.py "$@"
