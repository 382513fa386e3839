#!/usr/bin/env bash
# Builds one of coord's images without pulling anything (see Dockerfile.offline):
#
#   deploy/build-offline-image.sh [--target coordinator|coord-proxy] [TAG] [BIN_DIR]
#
# The target is the image, as in deploy/Dockerfile: `coordinator` (the default; TAG defaults to
# coord:latest) holds coordinator and coordctl, `coord-proxy` (TAG coord-proxy:latest) the
# sidecar. BIN_DIR holds the binaries; without it they are built first (cargo build --release, a
# no-op when they are up to date) and taken from target/release (or $CARGO_TARGET_DIR/release).
set -euo pipefail
cd "$(dirname "$0")/.."
target=coordinator
if [[ ${1:-} == --target ]]; then
  target=${2:?--target needs coordinator or coord-proxy}
  shift 2
fi
case $target in
  # bash: the training Job's startup probe (deploy/k8s/tls/training-job.yaml) opens the proxy's
  # port with it.
  coordinator) programs=(coordinator coordctl) default_tag=coord:latest ;;
  coord-proxy) programs=(coord-proxy /bin/bash) default_tag=coord-proxy:latest ;;
  *) echo "$0: unknown target $target (coordinator or coord-proxy)" >&2; exit 2 ;;
esac
tag=${1:-$default_tag}
if [[ -n ${2:-} ]]; then
  bins=$2
else
  cargo build --release -p coord-server --bin coordinator -p coord-agent --bin coordctl --bin coord-proxy
  bins=${CARGO_TARGET_DIR:-target}/release
fi
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
# The target's stage copies the image's files from a directory named after it.
mkdir -p "$ctx/data"
deploy/image-rootfs.sh "$ctx/$target" "$bins" "${programs[@]}"
# Only the target's stage of Dockerfile.offline: a builder without BuildKit would also build the
# stages before it, and leave their images behind.
awk -v stage="FROM scratch AS $target" '/^FROM / { on = ($0 == stage) } on' \
  deploy/Dockerfile.offline > "$ctx/Dockerfile"
docker build -q -t "$tag" "$ctx"
