#!/usr/bin/env bash
# A local Kubernetes cluster for tests and the demo: real etcd, kube-apiserver, scheduler and
# controller-manager built by hack/tools.sh, plus kwok fake nodes that look like IBM Cloud
# MI300X workers (amd.com/gpu: 8, amd.com/nic: 8, AMD and IBM labels) and a few shared
# PersistentVolumes for checkpoint claims. No Docker needed. kwok plays kubelet only for nodes
# annotated kwok.x-k8s.io/node=fake (hack/cluster/kwokctl.yaml): the fake nodes carry it,
# process-backed nodes (test/nodeagent) never do, so their pods are the agent's alone.
#   hack/cluster.sh up [NODES]   start (or reuse) the cluster with NODES fake nodes (default 4, 1..2050)
#   hack/cluster.sh scale NODES  set the number of fake nodes
#   hack/cluster.sh down         delete the cluster
#   hack/cluster.sh kubeconfig   print the kubeconfig path
# ZAYA_CLUSTER names the cluster (default zaya); state lives under bin/kwok-state/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=hack/tools/versions.env
source "$root/hack/tools/versions.env"
bin="$root/bin"
name=${ZAYA_CLUSTER:-zaya}
export KWOK_WORKDIR="$bin/kwok-state"
export KWOK_KUBE_VERSION=$KUBE_VERSION
export KWOK_KUBECTL_BINARY="$bin/kubectl"
kubeconfig="$KWOK_WORKDIR/clusters/$name/kubeconfig.yaml"
kwokctl() { "$bin/kwokctl" --name "$name" "$@"; }
kubectl() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }
log() { echo "cluster: $*" >&2; }

check_nodes() {
	[[ $1 =~ ^[0-9]+$ ]] && [ "$1" -ge 1 ] && [ "$1" -le 2050 ] || { echo "cluster: NODES must be 1..2050, got '$1'" >&2; exit 2; }
}

scale() {
	check_nodes "$1"
	log "scaling to $1 fake MI300X nodes"
	kwokctl -c "$root/hack/cluster/mi300x-node.yaml" scale node --replicas "$1" >/dev/null 2>&1
	# Ready within 60 s or fail loudly.
	local i ready=0
	for i in $(seq 1 120); do
		ready=$(kubectl get nodes --no-headers 2>/dev/null | grep -c ' Ready ' || true)
		[ "$ready" -ge "$1" ] && break
		sleep 0.5
	done
	[ "$ready" -ge "$1" ] || { log "only $ready of $1 nodes became Ready"; exit 1; }
}

# selective: kwok was started by this script's current config, managing only annotated nodes
# (a cluster started before that managed every node, the agent's included).
selective() {
	grep -q -- '--manage-nodes-with-annotation-selector=' "$KWOK_WORKDIR/clusters/$name/kwok.yaml" 2>/dev/null
}

up() {
	local nodes=${1:-4}
	check_nodes "$nodes"
	"$root/hack/tools.sh" cluster
	if kubectl get --raw /readyz >/dev/null 2>&1 && ! selective; then
		log "cluster $name runs kwok for every node: recreating it"
		kwokctl delete cluster >/dev/null 2>&1 || true
	fi
	if ! kubectl get --raw /readyz >/dev/null 2>&1; then
		kwokctl delete cluster >/dev/null 2>&1 || true
		mkdir -p "$KWOK_WORKDIR"
		log "starting control plane $KUBE_VERSION (etcd $ETCD_VERSION, kwok $KWOK_VERSION)"
		kwokctl -c "$root/hack/cluster/kwokctl.yaml" -c "$root/hack/cluster/mi300x-node.yaml" \
			-c "$root/hack/cluster/stages.yaml" create cluster \
			--runtime binary \
			--etcd-binary "$bin/etcd" \
			--kube-apiserver-binary "$bin/kube-apiserver" \
			--kube-controller-manager-binary "$bin/kube-controller-manager" \
			--kube-scheduler-binary "$bin/kube-scheduler" \
			--kwok-controller-binary "$bin/kwok" \
			--disable-qps-limits \
			--wait 60s >"$KWOK_WORKDIR/$name-create.log" 2>&1 ||
			{ log "kwokctl create cluster failed:"; cat "$KWOK_WORKDIR/$name-create.log" >&2; exit 1; }
	fi
	scale "$nodes"
	kubectl apply -f "$root/hack/cluster/checkpoint-volumes.yaml" >/dev/null
	echo "$kubeconfig"
}

case ${1:-} in
up) up "${2:-4}" ;;
scale) scale "${2:?NODES}" ;;
down) [ -x "$bin/kwokctl" ] && kwokctl delete cluster >/dev/null 2>&1 || true ;;
kubeconfig) echo "$kubeconfig" ;;
*) sed -n '2,10p' "$0" >&2; exit 2 ;;
esac
