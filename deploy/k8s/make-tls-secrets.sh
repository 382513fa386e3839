#!/usr/bin/env bash
# Makes a test CA and the certificates of the Kubernetes ensemble (deploy/k8s/base/coord.yaml), and
# stores them as Secrets:
#   coord-tls                       ca.crt, replica-<id>.crt/.key of replicas 1-3 (the StatefulSet)
#   coord-task-<job>-<index>        ca.crt, tls.crt, tls.key of each task (for its coord-proxy)
#   coord-client-ops                ca.crt, tls.crt, tls.key of an operator (coordctl)
#
#   deploy/k8s/make-tls-secrets.sh NAMESPACE [JOB=COUNT ...]     e.g. default worker=4
#
# The certificates stay in ./certs-NAMESPACE (of the directory it is run from) as well: keep
# ca.key safe, or delete it.
set -euo pipefail
ns=${1:?usage: deploy/k8s/make-tls-secrets.sh NAMESPACE [JOB=COUNT ...]}
shift
dir=$PWD/certs-$ns
cd "$(dirname "$0")/../.."
args=(ensemble --client ops)
for i in 1 2 3; do
  pod=coord-$((i - 1)).coord-peers.$ns.svc
  # A replica is reached by its pod's name (peers) and by the Service `coord` (clients).
  args+=(--replica "$i=$pod,$pod.cluster.local,coord,coord.$ns.svc,coord.$ns.svc.cluster.local")
done
for tasks in "$@"; do
  args+=(--task "$tasks")
done
deploy/make-certs.sh "$dir" "${args[@]}"
secret() {
  kubectl -n "$ns" create secret generic "$1" "${@:2}" --dry-run=client -o yaml | kubectl apply -f -
}
secret coord-tls --from-file="$dir/ca.crt" \
  --from-file="$dir/replica-1.crt" --from-file="$dir/replica-1.key" \
  --from-file="$dir/replica-2.crt" --from-file="$dir/replica-2.key" \
  --from-file="$dir/replica-3.crt" --from-file="$dir/replica-3.key"
for crt in "$dir"/task-*.crt "$dir"/client-*.crt; do
  [[ -e $crt ]] || continue
  name=$(basename "$crt" .crt)
  secret "coord-$name" --from-file="ca.crt=$dir/ca.crt" --from-file="tls.crt=$crt" \
    --from-file="tls.key=${crt%.crt}.key"
done
