#!/usr/bin/env bash
# make test-kind: the operator on real kubelets. A kind cluster (one control plane, 4 workers
# with fake MI300X devices from test/fakedeviceplugin) from the node image built here
# (hack/kind/node-image.sh; KIND_NODE_IMAGE=kindest/node:... for users with a registry), the
# project's images built here and loaded, the chart installed as users install it (the
# operator runs as a pod from its image, in a namespace enforcing Pod Security "restricted"),
# the smoke sample through it, then the e2e suite (test/e2e) on the kind world: the tests the
# kwok cluster runs, with real workers and real faults, and the recovery matrix that needs a
# real kubelet. The cluster is deleted at the end, whatever happened (KIND_KEEP=1 keeps it).
# Extra arguments go to `go test`.
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
export KIND_CLUSTER=${KIND_CLUSTER:-zaya-kind}
export KIND_SHARED_DIR=${KIND_SHARED_DIR:-$bin/kind-shared}
cluster=$root/hack/kind/cluster.sh
log() { echo "kind-e2e: $(date +%T) $*" >&2; }
start=$SECONDS

"$root/hack/tools.sh" kind helm
"$root/hack/images.sh"
log "images ready after $((SECONDS - start))s"
# Debian's CPU PyTorch for the PyTorch example's test, built while the cluster comes up (its
# install waits on Debian's mirror more than on the CPUs; a layer cached once made).
pytorch_log=$(mktemp)
"$root/hack/images.sh" pytorch >"$pytorch_log" 2>&1 &
pytorch_build=$!
trap '[ "${KIND_KEEP:-}" = 1 ] || "$cluster" down' EXIT
workers=${KIND_WORKERS:-4}
KUBECONFIG=$("$cluster" up "$workers")
export KUBECONFIG
log "cluster ready after $((SECONDS - start))s"
kubectl=$bin/kubectl
wait "$pytorch_build" || { cat "$pytorch_log" >&2; log "building the PyTorch image failed"; exit 1; }
cat "$pytorch_log" >&2
rm -f "$pytorch_log"
"$cluster" load zaya-pytorch:dev
log "PyTorch image loaded after $((SECONDS - start))s"

# The chart, as users install it, with the image loaded into the nodes.
"$kubectl" create namespace zaya-system
"$kubectl" label namespace zaya-system pod-security.kubernetes.io/enforce=restricted
# On the control plane: an operator on a GPU node shares that node's faults (a frozen node
# froze the operator with it before it could replace the node's rank; docs/getting-started.md).
values=$(mktemp)
cat >"$values" <<'YAML'
image: {repository: zaya-operator, tag: dev, pullPolicy: Never}
# The worker image holds zaya-supervisor: jobs that leave supervisor: Inject get it copied in.
supervisorImage: zaya-worker:dev
# As the kwok suite runs its operator: a straggler shows within seconds.
progressPoll: {interval: 1s}
nodeSelector: {node-role.kubernetes.io/control-plane: ""}
tolerations: [{key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoSchedule}]
YAML
"$bin/helm" install zaya-operator "$root/charts/zaya-operator" -n zaya-system -f "$values" --wait --timeout 3m
rm -f "$values"
log "operator installed after $((SECONDS - start))s"
dump() {
	"$kubectl" -n zaya-system logs deploy/zaya-operator --tail=200 >&2 || true
	"$kubectl" get nodes,pods -A -o wide >&2 || true
}

# The smoke sample on the CPU worker image, without its checkpoint claim (kind's only storage
# class cannot provision ReadWriteMany; test/kind binds its own shares).
"$kubectl" create namespace kind-smoke
sed -e 's#ghcr.io/zaya-operator/zaya-worker:latest#zaya-worker:dev#' -e '/^  checkpoint:/,/^      steps:/d' \
	"$root/config/samples/smoke.yaml" | "$kubectl" apply --server-side -n kind-smoke -f -
"$kubectl" wait -n kind-smoke --for=condition=Running --timeout=180s ztj/smoke || { dump; exit 1; }
"$kubectl" delete namespace kind-smoke --wait
log "smoke sample ran after $((SECONDS - start))s"

ZAYA_E2E_WORLD=kind ZAYA_E2E_KUBECTL=$kubectl ZAYA_KIND_SHARED_DIR=$KIND_SHARED_DIR ZAYA_KIND_WORKER_IMAGE=zaya-worker:dev \
	ZAYA_KIND_PYTORCH_IMAGE=zaya-pytorch:dev \
	ZAYA_KIND_CLUSTER_SCRIPT=$cluster ZAYA_KIND_WORKERS=$workers \
	go test -tags e2e -count=1 -timeout 60m "$@" ./test/e2e/... || { dump; exit 1; }
log "done after $((SECONDS - start))s"
