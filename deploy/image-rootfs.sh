#!/usr/bin/env bash
# Fills ROOTFS with the files of one of coord's images, for a FROM-scratch image or a slim base:
# deploy/build-offline-image.sh runs it on this machine, deploy/Dockerfile in its build stage.
#
#   deploy/image-rootfs.sh ROOTFS BIN_DIR PROGRAM...
#
# A PROGRAM without a slash is a binary of BIN_DIR, installed in /usr/local/bin without its debug
# info: `objcopy --strip-debug` keeps the symbol table, so a panic's backtrace still names its
# functions, and the binary keeps its build id, so the unstripped one in BIN_DIR is its symbol
# file for a crash report. A PROGRAM with a slash (/bin/bash) is copied as it is, to the same path.
# Every shared library `ldd` lists for a program goes to its own path, with the dynamic loader;
# /etc gets the user and group coord (10001) and a name service configuration.
set -euo pipefail
if [[ $# -lt 3 ]]; then
  echo "usage: $0 ROOTFS BIN_DIR PROGRAM..." >&2
  exit 2
fi
root=$1
bins=$2
shift 2
mkdir -p "$root/usr/local/bin" "$root/etc"
for program in "$@"; do
  if [[ $program == */* ]]; then
    src=$program
    mkdir -p "$root$(dirname "$program")"
    cp -L "$src" "$root$program"
  else
    src=$bins/$program
    objcopy --strip-debug "$src" "$root/usr/local/bin/$program"
  fi
  ldd "$src" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' |
    while read -r lib; do
      mkdir -p "$root$(dirname "$lib")"
      cp -L "$lib" "$root$lib"
    done
done
echo "coord:x:10001:10001:coord:/var/lib/coord:/nonexistent" > "$root/etc/passwd"
echo "coord:x:10001:" > "$root/etc/group"
# The other replicas' names are resolved through Docker's (or the cluster's) DNS.
echo "hosts: files dns" > "$root/etc/nsswitch.conf"
