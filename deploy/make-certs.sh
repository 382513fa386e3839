#!/usr/bin/env bash
# Makes a test CA and the certificates of a coord ensemble, with coord-certs (built here, rcgen).
#
#   deploy/make-certs.sh DIR
#       the local ensemble of local-ensemble.sh: replicas 1-3 on 127.0.0.1, tasks worker/0..3,
#       an operator's certificate `client-ops` (for coordctl)
#   deploy/make-certs.sh DIR ensemble --replica 1=coord1,127.0.0.1 --task worker=2 --client ops
#   deploy/make-certs.sh DIR task --job worker --index 7      # one more, signed by DIR's CA
#       anything `coord-certs` takes (see `coord-certs --help`)
#
# DIR gets ca.crt/ca.key, replica-<id>.crt/.key, task-<job>-<index>.crt/.key, client-<name>.crt/.key
# (keys readable by their owner only). For tests and trials; any CA will do in production, as
# long as the certificates carry the identities docs/operations.md's "TLS" section describes.
set -euo pipefail
dir=$(realpath -m "${1:?usage: deploy/make-certs.sh DIR [coord-certs arguments]}")
shift
cd "$(dirname "$0")/.."
cargo build --release --quiet -p coord-tools --bin coord-certs
if [[ $# -eq 0 ]]; then
  set -- ensemble --replica 1=127.0.0.1,localhost --replica 2=127.0.0.1,localhost \
    --replica 3=127.0.0.1,localhost --task worker=4 --client ops
fi
exec target/release/coord-certs --dir "$dir" "$@"
