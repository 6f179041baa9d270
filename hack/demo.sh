#!/usr/bin/env bash
# make demo: the operator's main job on a local cluster of fake MI300X nodes. Builds what it
# needs (slow the first time: it compiles Kubernetes; README.md, "Time and disk"), starts the
# cluster, installs the CRD, runs the operator, applies the smoke sample and shows what happened.
# DEMO_KEEP=1 leaves the cluster running afterwards and prints how to use and remove it.
# Step titles are bold only on a terminal and without NO_COLOR (https://no-color.org).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export ZAYA_CLUSTER=${ZAYA_CLUSTER:-zaya-demo}
if [ -t 1 ] && [ -z "${NO_COLOR:-}" ]; then
	step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
else
	step() { printf '\n== %s\n' "$*"; }
fi

step "building pinned tools and control plane (cached under bin/)"
"$root/hack/tools.sh" cluster
go build -o "$bin/zaya-operator" "$root"
go build -o "$bin/zaya-worker" "$root/workers/cmd/zaya-worker"
go build -o "$bin/demotrain" "$root/hack/demotrain"

step "starting a local cluster: real kube-apiserver, scheduler, controller-manager, etcd; 4 fake MI300X nodes"
KUBECONFIG=$("$root/hack/cluster.sh" up 4)
export KUBECONFIG
cleanup() {
	stop_operator
	if [ "${DEMO_KEEP:-}" = 1 ]; then
		local q_root q_kc q_name
		printf -v q_root %q "$root"
		printf -v q_kc %q "$KUBECONFIG"
		printf -v q_name %q "$ZAYA_CLUSTER"
		cat <<-EOF

			The cluster $ZAYA_CLUSTER is still running (DEMO_KEEP=1). Use the pinned kubectl in bin/
			(built for this cluster's version; another kubectl may not match it):
			  cd $q_root
			  export KUBECONFIG=$q_kc
			  bin/kubectl get ztj,pods
			The operator has stopped, so nothing reconciles the jobs; to run it again:
			  bin/zaya-operator --kubeconfig "\$KUBECONFIG" --metrics-bind-address=0 --health-probe-bind-address=0
			Remove the cluster (from the same folder):
			  ZAYA_CLUSTER=$q_name hack/cluster.sh down
		EOF
	else
		"$root/hack/cluster.sh" down >/dev/null 2>&1 || true
	fi
}
trap cleanup EXIT
"$bin/kubectl" get nodes -L amd.com/gpu.product-name,node.kubernetes.io/instance-type,topology.kubernetes.io/zone
echo
"$bin/kubectl" get nodes -o custom-columns='NODE:.metadata.name,AMD.COM/GPU:.status.allocatable.amd\.com/gpu,AMD.COM/NIC:.status.allocatable.amd\.com/nic,CPU:.status.allocatable.cpu,MEMORY:.status.allocatable.memory'

step "installing the ZayaTrainingJob CRD"
install_crd
"$bin/kubectl" get crd zayatrainingjobs.training.zaya.dev

step "running the operator (log: bin/demo-operator.log)"
# The process-backed nodes' pods are reached through demotrain's pod-network proxy: the
# operator polls rank 0's progress (goodput, stragglers) as it would on a cluster.
proxy_addr="127.0.0.1:$((20000 + RANDOM % 20000))"
start_operator "$bin/demo-operator.log" --worker-proxy="http://$proxy_addr" --progress-poll-interval=2s

step "kubectl apply -f config/samples/smoke.yaml"
"$bin/kubectl" apply --server-side -f "$root/config/samples/smoke.yaml"

step "a bad manifest is refused at apply time"
sed 's/name: smoke/name: smoke-bad/; s/nodes: 2/nodes: 3/; s/profile: Socket/profile: Socket\n    nicsPerNode: 2\n  parallelism:\n    contextParallel: 5/' "$root/config/samples/smoke.yaml" |
	"$bin/kubectl" apply --server-side -f - 2>&1 | sed 's/^/  /' || true

step "waiting for the gang: 2 worker pods, one per MI300X node, all Running"
if ! "$bin/kubectl" wait --for=condition=Running --timeout=60s ztj/smoke; then
	echo "the job did not reach Running; the operator's log:" >&2
	tail -50 "$bin/demo-operator.log" >&2
	"$bin/kubectl" get pods -o wide >&2
	exit 1
fi
"$bin/kubectl" get ztj
echo
"$bin/kubectl" get pods -o wide -L training.zaya.dev/rank,training.zaya.dev/attempt
echo
"$bin/kubectl" get svc,pvc
echo
echo "conditions:"
"$bin/kubectl" get ztj smoke -o jsonpath='{range .status.conditions[*]}  {.type}={.status} ({.reason}): {.message}{"\n"}{end}'
echo
echo "rank 1's contract environment (docs/worker-contract.md):"
env=$("$bin/kubectl" get pod smoke-0-1 -o jsonpath='{range .spec.containers[0].env[*]}  {.name}={.value}{"\n"}{end}')
printf '%s\n' "$env" | sed -n '1,22p'
echo "  ... ($(printf '%s\n' "$env" | wc -l) variables)"
echo
"$bin/kubectl" get events --field-selector involvedObject.name=smoke

step "suspend: the pods go, the checkpoint claim stays"
"$bin/kubectl" patch ztj smoke --type=merge -p '{"spec":{"suspend":true}}' >/dev/null
"$bin/kubectl" wait --for=condition=Suspended --timeout=30s ztj/smoke
"$bin/kubectl" get pods,pvc

step "real training: the reference worker on process-backed nodes; a worker killed, a node hung, then a node lost with none free, on purpose"
(cd "$root" && "$bin/demotrain" -worker "$bin/zaya-worker" -workdir "$bin/demo-nodes" -proxy "$proxy_addr")

step "done"
echo "A 2-node x 8 GPU job ran as a gang on a local cluster of fake MI300X nodes; then a 4-node"
echo "job of the reference worker trained for real, lost a worker process (restarted in place,"
echo "no pod replaced) and then a node hung (only its rank's pod replaced, elsewhere; the other"
echo "ranks restarted in place), and last lost a node with no node free (it trained on 3 nodes,"
echo "then grew back to 4 at a checkpoint once a node was schedulable again), resuming from its"
echo "checkpoint each time, without a human."
