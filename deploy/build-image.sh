#!/usr/bin/env bash
# Build the static gateway binary and the FROM-scratch image around it (deploy/Dockerfile).
#
#   deploy/build-image.sh [TAG]          default tag: $GATEWAY_IMAGE or gateway:dev
#
# The binary: cargo build --profile dist --locked --target x86_64-unknown-linux-gnu with a static
# glibc, in $CARGO_TARGET_DIR (default ./target) under x86_64-unknown-linux-gnu/dist/gateway. The
# dist profile is the release one with link-time optimisation (Cargo.toml): about twice the cold
# build time; GATEWAY_IMAGE_PROFILE=release builds the quick way. The image gets a build context of
# its own holding only the binary and an empty data dir.
set -euo pipefail
cd "$(dirname "$0")/.."

TAG="${1:-${GATEWAY_IMAGE:-gateway:dev}}"
TRIPLE=x86_64-unknown-linux-gnu
TARGET_DIR="${CARGO_TARGET_DIR:-target}"
PROFILE="${GATEWAY_IMAGE_PROFILE:-dist}"
BIN="$TARGET_DIR/$TRIPLE/$PROFILE/gateway"

say() { echo "build-image: $*" >&2; }
die() { echo "build-image: error: $*" >&2; exit 1; }

command -v docker >/dev/null 2>&1 || die "docker is not installed (the image is built with 'docker build')"
docker info >/dev/null 2>&1 || die "cannot reach the Docker daemon ('docker info' failed): is it running, may this user use it?"
command -v cargo >/dev/null 2>&1 || die "cargo is not installed"
if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx "$TRIPLE"; then
  die "the Rust target $TRIPLE is not installed (rustup target add $TRIPLE)"
fi

say "static binary: cargo build --profile $PROFILE --locked --target $TRIPLE (CARGO_TARGET_DIR=$TARGET_DIR)"
t0=$SECONDS
RUSTFLAGS="-C target-feature=+crt-static" cargo build --profile "$PROFILE" --locked --target "$TRIPLE"
[[ -x "$BIN" ]] || die "the build did not produce $BIN"
# A dynamically linked binary has a program interpreter (ld-linux); in an empty image it cannot start.
if command -v readelf >/dev/null 2>&1 && readelf -l "$BIN" | grep -q 'Requesting program interpreter'; then
  die "$BIN is dynamically linked (was RUSTFLAGS overridden?)"
fi
say "binary: $BIN ($(du -h "$BIN" | cut -f1), $((SECONDS - t0)) s)"

ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
install -m 0755 "$BIN" "$ctx/gateway"
mkdir -m 0700 "$ctx/data"
cp deploy/Dockerfile "$ctx/Dockerfile"

say "image: docker build -t $TAG"
t0=$SECONDS
docker build --label "org.opencontainers.image.revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)" \
  -t "$TAG" "$ctx"
say "image $TAG built in $((SECONDS - t0)) s: $(docker image inspect -f '{{.Id}} {{.Size}} bytes' "$TAG")"
