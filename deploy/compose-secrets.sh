#!/usr/bin/env bash
# Generate the secrets deploy/compose.yaml mounts, once: cluster.secret, device.secret and
# backend.secret (64 hex characters each) in DIR (default deploy/secrets, which git ignores).
# Existing files are kept, so running it again changes nothing.
#
#   deploy/compose-secrets.sh [DIR]
#
# Compose without Swarm bind-mounts secret files with their host owner and mode, and the node runs
# as uid 10001: as root the files are given to 10001 with mode 0400; otherwise they are mode 0644
# inside a mode 0700 directory (other host users cannot reach them; the container can read them).
set -euo pipefail
DIR="${1:-${GATEWAY_SECRETS_DIR:-$(dirname "$0")/secrets}}"
mkdir -p "$DIR"
chmod 700 "$DIR"
for name in cluster device backend; do
  f="$DIR/$name.secret"
  if [[ -s "$f" ]]; then
    echo "kept      $f"
    continue
  fi
  (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$f")
  echo "generated $f"
done
for name in cluster device backend; do
  f="$DIR/$name.secret"
  if [[ $(id -u) == 0 ]]; then
    chown 10001:10001 "$f" && chmod 400 "$f"
  else
    chmod 644 "$f"
  fi
done
