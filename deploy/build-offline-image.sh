#!/usr/bin/env bash
# Builds the coordinator image without pulling anything (see Dockerfile.offline).
#
#   deploy/build-offline-image.sh [TAG] [BIN_DIR]
#
# TAG defaults to coord:latest. BIN_DIR holds coordinator, coordctl and coord-proxy; it defaults
# to target/release, built first if a binary is missing there.
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-coord:latest}
bins=${2:-target/release}
if [[ ! -x $bins/coordinator || ! -x $bins/coordctl || ! -x $bins/coord-proxy ]]; then
  cargo build --release -p coord-server --bin coordinator -p coord-agent --bin coordctl --bin coord-proxy
  bins=target/release
fi
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/rootfs/usr/local/bin" "$ctx/rootfs/etc" "$ctx/data"
for b in coordinator coordctl coord-proxy; do
  # Debug info is for developers; the image ships without it.
  objcopy --strip-debug "$bins/$b" "$ctx/rootfs/usr/local/bin/$b"
  # Every shared library the binary links, at the same path, and the dynamic loader.
  ldd "$bins/$b" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' |
    while read -r lib; do
      mkdir -p "$ctx/rootfs$(dirname "$lib")"
      cp -L "$lib" "$ctx/rootfs$lib"
    done
done
echo "coord:x:10001:10001:coord:/var/lib/coord:/nonexistent" > "$ctx/rootfs/etc/passwd"
echo "coord:x:10001:" > "$ctx/rootfs/etc/group"
# The other replicas' names are resolved through Docker's (or the cluster's) DNS.
echo "hosts: files dns" > "$ctx/rootfs/etc/nsswitch.conf"
cp deploy/Dockerfile.offline "$ctx/Dockerfile"
docker build -q -t "$tag" "$ctx"
