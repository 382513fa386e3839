#!/usr/bin/env bash
# Starts a local 3-replica coord ensemble and keeps it in the foreground; Ctrl-C stops all three.
#
#   replica 1: gRPC 127.0.0.1:7101, HTTP 127.0.0.1:8101   (data in $COORD_DATA/1)
#   replica 2: gRPC 127.0.0.1:7102, HTTP 127.0.0.1:8102
#   replica 3: gRPC 127.0.0.1:7103, HTTP 127.0.0.1:8103
#
# COORD_DATA (default ./data) holds the data; run the script again to restart the same ensemble.
# COORD_TLS=1 serves TLS, with a test CA and certificates made in $COORD_DATA/certs on the first
# run (deploy/make-certs.sh); clients then need --tls-ca (and, for an operator, the certificate
# client-ops). The three replicas share this machine, so each runs one runtime thread.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p coord-server --bin coordinator -p coord-agent --bin coordctl
bin=target/release/coordinator
data=${COORD_DATA:-./data}
cluster=1=127.0.0.1:7101,2=127.0.0.1:7102,3=127.0.0.1:7103
certs=$data/certs
if [[ ${COORD_TLS:-0} == 1 && ! -f $certs/ca.crt ]]; then
  deploy/make-certs.sh "$certs"
fi
pids=()
stop() {
  trap - EXIT INT TERM
  kill "${pids[@]}" 2>/dev/null || true
  wait || true
}
trap stop EXIT INT TERM
for i in 1 2 3; do
  tls=()
  if [[ ${COORD_TLS:-0} == 1 ]]; then
    tls=(--tls-cert "$certs/replica-$i.crt" --tls-key "$certs/replica-$i.key" --tls-ca "$certs/ca.crt")
  fi
  "$bin" --id "$i" --listen "127.0.0.1:710$i" --http-listen "127.0.0.1:810$i" \
    --initial-cluster "$cluster" --data-dir "$data/$i" --worker-threads 1 "${tls[@]}" &
  pids+=($!)
done
if [[ ${COORD_TLS:-0} == 1 ]]; then
  echo "coord ensemble starting over TLS; try: target/release/coordctl --tls-ca $certs/ca.crt" \
    "--tls-cert $certs/client-ops.crt --tls-key $certs/client-ops.key status   (Ctrl-C stops it)"
else
  echo "coord ensemble starting; try: target/release/coordctl status   (Ctrl-C stops it)"
fi
wait
