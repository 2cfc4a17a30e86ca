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
#
# GATEWAY_IMAGE_PGO=1 makes the binary a profile-guided one, in three steps: an instrumented build
# (-Cprofile-generate, in $CARGO_TARGET_DIR/pgo-generate), deploy/pgo-train.sh running it as a
# three-node cluster on loopback under a training load (about a minute), and the build the image
# gets (-Cprofile-use of the merged profile, in $CARGO_TARGET_DIR/pgo-use): about twice the
# profile's build time and a minute. It needs llvm-profdata of the compiler's LLVM (rustup
# component add llvm-tools) and python3. The merged profile is kept as pgo-use/gateway-<hash>.profdata;
# every new profile rebuilds all crates with it.
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

PGO="${GATEWAY_IMAGE_PGO:-0}"
[[ "$PGO" == 0 || "$PGO" == 1 ]] || die "GATEWAY_IMAGE_PGO must be 0 or 1, got '$PGO'"
# One flag (no space): it goes into RUSTFLAGS and into CARGO_ENCODED_RUSTFLAGS alike.
STATIC="-Ctarget-feature=+crt-static"

t0=$SECONDS
if [[ "$PGO" == 1 ]]; then
  PROFDATA="$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin/llvm-profdata"
  [[ -x "$PROFDATA" ]] || die "a profile-guided build needs llvm-profdata of this compiler ($PROFDATA): rustup component add llvm-tools"
  command -v python3 >/dev/null 2>&1 || die "a profile-guided build needs python3 (deploy/pgo-load.py)"
  # Checked before the instrumented build, not after it: the training's device rounds need these.
  (( $(ulimit -Hn) >= 2600 )) || die "a profile-guided build's training needs an open-files limit of 2600 or more (ulimit -Hn: $(ulimit -Hn))"
  GEN_DIR="$TARGET_DIR/pgo-generate" USE_DIR="$TARGET_DIR/pgo-use"
  mkdir -p "$TARGET_DIR"
  TRAIN="$(realpath "$TARGET_DIR")/pgo-train"
  rm -rf "$TRAIN"
  say "PGO 1/3: instrumented binary: cargo build --profile $PROFILE (CARGO_TARGET_DIR=$GEN_DIR)"
  # Encoded (flags apart by 0x1f), so that a path with a space stays one flag.
  CARGO_ENCODED_RUSTFLAGS="$STATIC"$'\x1f'"-Cprofile-generate=$TRAIN/profile" \
    CARGO_TARGET_DIR="$GEN_DIR" cargo build --profile "$PROFILE" --locked --target "$TRIPLE"
  say "PGO 2/3: training (deploy/pgo-train.sh, output in $TRAIN)"
  deploy/pgo-train.sh "$GEN_DIR/$TRIPLE/$PROFILE/gateway" "$TRAIN"
  raws=()
  for f in "$TRAIN"/profile/*.profraw; do [[ -f "$f" ]] && raws+=("$f"); done
  [[ ${#raws[@]} == 3 ]] || die "the training left ${#raws[@]} profile(s), not one per node, in $TRAIN/profile"
  mkdir -p "$USE_DIR"
  rm -f "$USE_DIR"/gateway-*.profdata
  "$PROFDATA" merge -o "$USE_DIR/merged.profdata" "${raws[@]}"
  # Named by its content: cargo rebuilds what RUSTFLAGS changed for, not what a file changed for,
  # so a new profile must change the flags for every crate to be built with it.
  profile="$(realpath "$USE_DIR")/gateway-$(sha256sum "$USE_DIR/merged.profdata" | cut -c1-16).profdata"
  mv "$USE_DIR/merged.profdata" "$profile"
  say "PGO 3/3: the image's binary: cargo build --profile $PROFILE with $profile (CARGO_TARGET_DIR=$USE_DIR)"
  CARGO_ENCODED_RUSTFLAGS="$STATIC"$'\x1f'"-Cprofile-use=$profile" \
    CARGO_TARGET_DIR="$USE_DIR" cargo build --profile "$PROFILE" --locked --target "$TRIPLE"
  BIN="$USE_DIR/$TRIPLE/$PROFILE/gateway"
else
  say "static binary: cargo build --profile $PROFILE --locked --target $TRIPLE (CARGO_TARGET_DIR=$TARGET_DIR)"
  RUSTFLAGS="$STATIC" cargo build --profile "$PROFILE" --locked --target "$TRIPLE"
fi
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
