#!/usr/bin/env bash
# hack/kind-e2e.sh: the same Go e2e suite (test/e2e) against a kind cluster, for users with a
# Docker engine (our CI machines have none, so CI runs the suite on the local kwok cluster via
# make test-e2e; only the cluster bring-up differs).
#   - creates a kind cluster (KIND_CLUSTER, default zaya-kind) with 4 workers;
#   - gives every worker fake capacity amd.com/gpu: 8 and amd.com/nic: 8 plus the MI300X labels
#     (a status patch, as a device plugin would advertise them);
#   - builds the operator and CPU worker images and loads them into the cluster;
#   - installs the Helm chart with that image (helm install --wait, in a namespace enforcing
#     Pod Security "restricted"), runs the smoke sample until it is Running, uninstalls;
#   - runs go test -tags e2e ./test/e2e/... with KUBECONFIG pointing at kind.
# Tests that need the process-backed node agent start it themselves: its nodes join the kind
# cluster as extra (tainted) nodes served from this machine. Requires: docker, kind, kubectl.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
name=${KIND_CLUSTER:-zaya-kind}
for t in docker kind kubectl; do
	command -v "$t" >/dev/null || { echo "kind-e2e: $t is required" >&2; exit 1; }
done
docker info >/dev/null 2>&1 || { echo "kind-e2e: no Docker engine reachable" >&2; exit 1; }

cat <<YAML | kind create cluster --name "$name" --config - --wait 120s
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
- role: control-plane
- role: worker
- role: worker
- role: worker
- role: worker
YAML
trap '[ "${KIND_KEEP:-}" = 1 ] || kind delete cluster --name "$name"' EXIT
export KUBECONFIG
KUBECONFIG=$(mktemp)
kind get kubeconfig --name "$name" >"$KUBECONFIG"

# Fake GPUs: capacity and labels like an MI300X worker (hack/cluster/mi300x-node.yaml).
for node in $(kubectl get nodes -l '!node-role.kubernetes.io/control-plane' -o name); do
	kubectl patch "$node" --subresource=status --type=merge \
		-p '{"status":{"capacity":{"amd.com/gpu":"8","amd.com/nic":"8"}}}'
	kubectl label --overwrite "$node" amd.com/gpu.product-name=AMD_Instinct_MI300X_OAM amd.com/gpu.device-id=74a1 \
		feature.node.kubernetes.io/amd-gpu=true ibm-cloud.kubernetes.io/worker-pool-name=mi300x \
		topology.kubernetes.io/zone=kind-1 node.kubernetes.io/instance-type=gx3d-208x1792x8mi300x
done

docker build -t zaya-operator:e2e "$root"
docker build -f "$root/workers/Dockerfile" --target cpu -t zaya-worker:cpu "$root"
kind load docker-image --name "$name" zaya-operator:e2e zaya-worker:cpu

# The chart, as users install it: the operator pod from the image just loaded.
"$root/hack/tools.sh" helm
helm=$root/bin/helm
kubectl create namespace zaya-system
kubectl label namespace zaya-system pod-security.kubernetes.io/enforce=restricted
"$helm" install zaya-operator "$root/charts/zaya-operator" -n zaya-system \
	--set image.repository=zaya-operator --set image.tag=e2e --set image.pullPolicy=Never --wait --timeout 3m
kubectl create namespace kind-smoke
# The smoke sample on the CPU worker image, without its checkpoint claim: kind's only storage
# class cannot provision ReadWriteMany.
sed -e 's#ghcr.io/zaya-operator/zaya-worker:latest#zaya-worker:cpu#' -e '/^  checkpoint:/,/^      steps:/d' \
	"$root/config/samples/smoke.yaml" | kubectl apply --server-side -n kind-smoke -f -
kubectl wait -n kind-smoke --for=condition=Running --timeout=180s ztj/smoke ||
	{ kubectl -n zaya-system logs deploy/zaya-operator --tail=50 >&2; kubectl get pods -A >&2; exit 1; }
kubectl get ztj -n kind-smoke
kubectl delete namespace kind-smoke --wait
"$helm" uninstall zaya-operator -n zaya-system --wait

# The suite runs the operator binary itself against KUBECONFIG (so its log is at hand), as on
# the local cluster.
go build -o "$root/bin/zaya-operator" "$root"
go build -o "$root/bin/zaya-worker" "$root/workers/cmd/zaya-worker"
go build -o "$root/bin/zaya-supervisor" "$root/workers/cmd/zaya-supervisor"
ZAYA_E2E_KUBECTL=$(command -v kubectl) ZAYA_E2E_OPERATOR="$root/bin/zaya-operator" ZAYA_E2E_WORKER="$root/bin/zaya-worker" \
	ZAYA_E2E_SUPERVISOR="$root/bin/zaya-supervisor" \
	go test -tags e2e -count=1 "$@" "$root/test/e2e/..."
