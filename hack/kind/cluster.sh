#!/usr/bin/env bash
# hack/kind/cluster.sh: a real multi-node kind cluster (1 control plane + WORKERS workers)
# with nothing pulled: the node image is built here (hack/kind/node-image.sh), and so are the
# project's images (hack/images.sh), which are loaded into every node. Workers get fake AMD
# devices from the fake device plugin (test/fakedeviceplugin/deploy/daemonset.yaml):
# amd.com/gpu: 8 and amd.com/nic: 8 each.
#   hack/kind/cluster.sh up [WORKERS]   create (or reuse) the cluster (default 4 workers, 1..20)
#                                       and print its kubeconfig path
#   hack/kind/cluster.sh load IMAGE...  load images built here into the workers (not the
#                                       control plane, which runs no job)
#   hack/kind/cluster.sh down           delete it; leaves no container, network or volume
#   hack/kind/cluster.sh kubeconfig     print the kubeconfig path
#   KIND_CLUSTER     the cluster's name (default zaya-kind)
#   KIND_NODE_IMAGE  a node image to use instead of building one, e.g. a public kindest/node
#                    of KUBE_VERSION where a registry is reachable
#   KIND_SHARED_DIR  a host folder mounted at the same path into every node, for hostPath
#                    volumes shared by all nodes (checkpoints); default bin/kind-shared
# The pod network is ours, not kindnet (an image we cannot pull): ptp + host-local on each
# node for its podCIDR, and routes between nodes over the kind Docker network
# (hack/kind/node/rootfs/usr/local/bin/zaya-pod-network). Nodes of our image re-apply their
# routes at boot, so a `docker restart` of a node keeps networking; if Docker gives a restarted
# node another address, run `up` again to re-route the others to it (a public kindest/node
# forgets its routes on restart: run `up` again too). `up` also starts nodes that are stopped
# (after a reboot: kind's nodes restart only on failure). kube-proxy runs in iptables mode.
# Hosts where privileged containers fail (a root without CAP_SYS_RESOURCE, as on our CI
# machines) run kind through hack/kind/shim/docker; others run plain kind.
# The kubelet writes host-wide sysctls (vm.overcommit_memory, kernel.panic, ...: /proc/sys is
# the host's in a node): `up` records them first, `down` restores them once no kind node runs.
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
# shellcheck source=hack/tools/versions.env
source "$root/hack/tools/versions.env"
name=${KIND_CLUSTER:-zaya-kind}
state=$bin/kind-state/$name
kubeconfig=$state/kubeconfig
shared=${KIND_SHARED_DIR:-$bin/kind-shared}
# Host-wide, like the sysctls: one record for every cluster of this checkout.
sysctl_record=$bin/kind-state/host-sysctls
pod_subnet=10.244.0.0/16
project_images=(zaya-operator:dev zaya-worker:dev zaya-fake-device-plugin:dev)
kind() { "$bin/kind" "$@"; }
kubectl() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }
log() { echo "kind-cluster: $*" >&2; }

# What a node's kubelet (setupKernelTunables) and systemd-sysctl (Debian's sysctl.d, masked
# in our image but not in kindest/node) set, none of it namespaced.
host_sysctls=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
	kernel.keys.root_maxkeys kernel.keys.root_maxbytes kernel.pid_max
	fs.protected_fifos fs.protected_hardlinks fs.protected_regular fs.protected_symlinks)
kind_containers() { docker ps -aq --filter label=io.x-k8s.kind.cluster "$@"; }
save_sysctls() {
	[ -f "$sysctl_record" ] && return
	if [ -n "$(kind_containers)" ]; then
		log "other kind nodes run already: host sysctls not recorded (they may be theirs)"
		return
	fi
	mkdir -p "${sysctl_record%/*}"
	local k
	for k in "${host_sysctls[@]}"; do
		[ -r "/proc/sys/${k//.//}" ] && echo "$k $(cat "/proc/sys/${k//.//}")"
	done >"$sysctl_record.tmp"
	mv "$sysctl_record.tmp" "$sysctl_record"
}
restore_sysctls() {
	[ -f "$sysctl_record" ] || return 0
	if [ -n "$(kind_containers)" ]; then
		log "other kind nodes still run: host sysctls stay as they are until they go"
		return
	fi
	local k v p
	while read -r k v; do
		p=/proc/sys/${k//.//}
		[ "$(cat "$p")" = "$v" ] && continue
		echo "$v" >"$p" 2>/dev/null && log "restored $k = $v" || log "cannot restore $k = $v"
	done <"$sysctl_record"
	rm -f "$sysctl_record"
}

exists() { kind get clusters 2>/dev/null | grep -qxF "$name"; }
nodes_of() { docker ps -a --filter "label=io.x-k8s.kind.cluster=$name" "$@" --format '{{.Names}}'; }

# kind_env IMAGE: how this host runs kind. A --privileged container that fails to start
# means kind goes through the shim. fuse-overlayfs Docker storage makes kind's entrypoint pick
# containerd's fuse-overlayfs snapshotter (no such binary in our image), though /var, where
# containerd keeps its layers, is a plain volume that overlayfs works on.
kind_env() {
	local err
	if ! err=$(docker run --rm --privileged --net none --entrypoint true "$1" 2>&1); then
		log "privileged containers fail here ($(grep -m1 -o 'unable to .*' <<<"$err" || head -1 <<<"$err")): kind runs through hack/kind/shim/docker"
		ZAYA_REAL_DOCKER=$(command -v docker)
		export ZAYA_REAL_DOCKER PATH=$root/hack/kind/shim:$PATH
	fi
	if [ -z "${KIND_EXPERIMENTAL_CONTAINERD_SNAPSHOTTER:-}" ] && [ "$(docker info -f '{{.Driver}}')" = fuse-overlayfs ] &&
		! docker info -f '{{.SecurityOptions}}' | grep -q rootless; then
		export KIND_EXPERIMENTAL_CONTAINERD_SNAPSHOTTER=overlayfs
	fi
}

# create WORKERS IMAGE
create() {
	local workers=$1 image=$2 i
	{
		echo "kind: Cluster"
		echo "apiVersion: kind.x-k8s.io/v1alpha4"
		echo "networking:"
		echo "  podSubnet: $pod_subnet"
		echo "  disableDefaultCNI: true"
		echo "  kubeProxyMode: iptables"
		echo "nodes:"
		for i in $(seq 0 "$workers"); do
			if [ "$i" = 0 ]; then echo "- role: control-plane"; else echo "- role: worker"; fi
			echo "  extraMounts:"
			echo "  - {hostPath: \"$shared\", containerPath: \"$shared\"}"
		done
		echo "kubeadmConfigPatches:"
		# Our etcd is ETCD_VERSION, not the one kubeadm pins; say so rather than mislabel it.
		if [ -z "${KIND_NODE_IMAGE:-}" ]; then
			echo "- |"
			echo "  kind: ClusterConfiguration"
			echo "  etcd: {local: {imageTag: \"${ETCD_VERSION#v}-0\"}}"
		fi
		echo "- |"
		echo "  kind: KubeletConfiguration"
		# In-place restarts: a default kubelet waits 10 s, doubling, before a container's
		# second restart within 10 minutes (docs/recovery.md asks for this setting).
		echo "  crashLoopBackOff: {maxContainerRestartPeriod: 1s}"
		# Kubernetes 1.35+ refuses cgroup v1 unless told otherwise.
		if [ "$(stat -fc %T /sys/fs/cgroup)" != cgroup2fs ]; then
			echo "  failCgroupV1: false"
		fi
	} >"$state/kind.yaml"
	log "creating $name: 1 control plane + $workers workers from $image"
	if ! kind create cluster --name "$name" --image "$image" --config "$state/kind.yaml" \
		--kubeconfig "$kubeconfig" >"$state/create.log" 2>&1; then
		cat "$state/create.log" >&2
		log "kind create cluster failed"
		exit 1
	fi
}

# pod_network: each node's CNI config for its podCIDR, and routes to every other node's.
pod_network() {
	local i cidrs= ok=
	for i in $(seq 1 120); do
		cidrs=$(kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name} {.spec.podCIDR}{"\n"}{end}' 2>/dev/null) || cidrs=
		if [ -n "$cidrs" ] && awk 'NF < 2 {bad=1} END {exit bad}' <<<"$cidrs"; then ok=1; break; fi
		sleep 1
	done
	[ -n "$ok" ] || { log "nodes without a podCIDR after 2 minutes: $cidrs"; exit 1; }
	# Addresses from Docker, not the Node objects: after a restart Docker may hand a node another
	# address before its kubelet reports it.
	local list= node cidr ip other ocidr oip
	while read -r node cidr; do
		ip=$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}' "$node" | cut -d' ' -f1)
		[ -n "$ip" ] || { log "node $node has no address on the kind network"; exit 1; }
		list+="$node $cidr $ip"$'\n'
	done <<<"$cidrs"
	list=${list%$'\n'}
	while read -r node cidr ip; do
		{
			echo "cluster-cidr $pod_subnet"
			while read -r other ocidr oip; do
				[ "$other" = "$node" ] || echo "route $ocidr $oip"
			done <<<"$list"
		} | docker exec -i "$node" sh -c 'mkdir -p /etc/zaya && cat >/etc/zaya/pod-network.conf'
		docker exec -i "$node" bash -s /etc/zaya/pod-network.conf <"$root/hack/kind/node/rootfs/usr/local/bin/zaya-pod-network"
		# Written last: the kubelet reports the node Ready once a CNI config is there. IPAM state
		# lives in /run, which a restarted node starts empty, as it starts with no pods.
		cat <<EOF | docker exec -i "$node" sh -c 'mkdir -p /etc/cni/net.d && cat >/etc/cni/net.d/.10-zaya.tmp && mv /etc/cni/net.d/.10-zaya.tmp /etc/cni/net.d/10-zaya.conflist'
{
  "cniVersion": "1.0.0",
  "name": "zaya",
  "plugins": [
    {
      "type": "ptp",
      "mtu": 1500,
      "ipam": {
        "type": "host-local",
        "dataDir": "/run/cni-ipam",
        "ranges": [[{"subnet": "$cidr"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
	done <<<"$list"
}

# device_plugin: the fake AMD devices on every worker.
device_plugin() {
	# What IBM Cloud puts on a worker of an MI300X pool (hack/cluster/mi300x-node.yaml has the
	# kwok nodes carry the same): not the kubelet's to set (NodeRestriction refuses
	# kubernetes.io labels it does not own), so set here, as IBM's own controllers do.
	kubectl label nodes -l '!node-role.kubernetes.io/control-plane' --overwrite >/dev/null \
		topology.kubernetes.io/zone=us-east-1 topology.kubernetes.io/region=us-east \
		ibm-cloud.kubernetes.io/worker-pool-name=mi300x ibm-cloud.kubernetes.io/worker-pool-id=pool-mi300x \
		ibm-cloud.kubernetes.io/zone=us-east-1 ibm-cloud.kubernetes.io/region=us-east \
		node.kubernetes.io/instance-type=gx3d.208x1792.8mi300x ibm-cloud.kubernetes.io/machine-type=gx3d.208x1792.8mi300x
	kubectl apply -f "$root/test/fakedeviceplugin/deploy/daemonset.yaml" >/dev/null
	kubectl -n kube-system rollout status daemonset/amd-fake-device-plugin --timeout=180s >/dev/null
	local i short
	for i in $(seq 1 120); do
		short=$(kubectl get nodes -l '!node-role.kubernetes.io/control-plane' -o jsonpath='{range .items[*]}{.metadata.name} {.status.allocatable.amd\.com/gpu} {.status.allocatable.amd\.com/nic}{"\n"}{end}' |
			awk '$2 != 8 || $3 != 8 {print $1}')
		[ -z "$short" ] && return
		sleep 1
	done
	log "workers without amd.com/gpu: 8 and amd.com/nic: 8 after 2 minutes: $short"
	exit 1
}

up() {
	local workers=${1:-4} start=$SECONDS
	[[ $workers =~ ^[0-9]+$ ]] && [ "$workers" -ge 1 ] && [ "$workers" -le 20 ] ||
		{ log "WORKERS must be 1..20, got '$workers'"; exit 2; }
	command -v docker >/dev/null && docker info >/dev/null 2>&1 || { log "no Docker engine reachable"; exit 1; }
	"$root/hack/tools.sh" kind >&2
	local image=${KIND_NODE_IMAGE:-}
	[ -n "$image" ] || image=$("$root/hack/kind/node-image.sh")
	mkdir -p "$state"
	# Pods run as non-root users (65532): like /tmp, anyone may write, only owners remove.
	[ -d "$shared" ] || { mkdir -p "$shared" && chmod 1777 "$shared"; }
	kind_env "$image"

	if exists; then
		local have_workers have_image
		have_workers=$(nodes_of --filter label=io.x-k8s.kind.role=worker | wc -l)
		have_image=$(docker inspect -f '{{.Config.Image}}' "$name-control-plane" 2>/dev/null || true)
		if [ "$have_workers" != "$workers" ] || [ "$have_image" != "$image" ] || [ ! -s "$kubeconfig" ]; then
			log "cluster $name has $have_workers workers of $have_image: recreating it"
			kind delete cluster --name "$name" --kubeconfig "$kubeconfig" >/dev/null 2>&1
		else
			# Nodes Docker did not restart (a reboot, a docker stop) start again here.
			local stopped
			stopped=$(nodes_of --filter status=exited --filter status=created)
			[ -z "$stopped" ] || { log "starting stopped nodes: $(echo $stopped)"; docker start $stopped >/dev/null; }
			log "reusing cluster $name"
		fi
	fi
	if ! exists; then
		save_sysctls
		create "$workers" "$image"
	fi

	pod_network
	kubectl wait --for=condition=Ready nodes --all --timeout=300s >/dev/null || {
		# Seen once (2026-12-07, the fourth cluster of a session): every worker not Ready
		# after 300 s, cause unknown. What the next one needs to tell.
		log "nodes not Ready after 300s:"
		kubectl get nodes -o wide >&2 || true
		local n
		for n in $(nodes_of); do
			echo "--- $n: kubelet's last lines" >&2
			docker exec "$n" journalctl -u kubelet --no-pager -n 20 >&2 2>&1 || true
		done
		exit 1
	}
	kubectl -n kube-system rollout status deployment/coredns --timeout=300s >/dev/null
	log "$((workers + 1)) nodes Ready, CoreDNS ready after $((SECONDS - start))s"

	local missing=() img
	for img in "${project_images[@]}"; do
		docker image inspect "$img" >/dev/null 2>&1 && continue
		case $img in
		zaya-operator:*) missing+=(operator) ;;
		zaya-worker:*) missing+=(worker) ;;
		zaya-fake-device-plugin:*) missing+=(device-plugin) ;;
		esac
	done
	[ ${#missing[@]} = 0 ] || ZAYA_IMAGE_TAG=dev ZAYA_IMAGE_PREFIX='' "$root/hack/images.sh" "${missing[@]}"
	kind load docker-image --name "$name" "${project_images[@]}" >"$state/load.log" 2>&1 ||
		{ cat "$state/load.log" >&2; log "kind load docker-image failed"; exit 1; }

	device_plugin
	log "cluster $name up in $((SECONDS - start))s; shared folder $shared"
	echo "$kubeconfig"
}

down() {
	if exists; then
		log "deleting cluster $name"
		kind delete cluster --name "$name" --kubeconfig "$kubeconfig" >/dev/null 2>&1
	fi
	rm -rf "$state"
	# kind leaves its Docker network behind; it goes once no container is attached to it.
	if docker network inspect kind >/dev/null 2>&1 &&
		[ "$(docker network inspect -f '{{len .Containers}}' kind)" = 0 ] && [ -z "$(kind_containers)" ]; then
		docker network rm kind >/dev/null
	fi
	restore_sysctls
}

load() {
	exists || { log "no cluster $name: run up first"; exit 1; }
	kind_env "$(docker inspect -f '{{.Config.Image}}' "$name-control-plane")"
	local start=$SECONDS
	kind load docker-image --name "$name" --nodes "$(nodes_of --filter label=io.x-k8s.kind.role=worker | paste -sd, -)" "$@" \
		>"$state/load.log" 2>&1 || { cat "$state/load.log" >&2; log "kind load docker-image failed"; exit 1; }
	log "loaded $* into the workers in $((SECONDS - start))s"
}

case ${1:-} in
up) up "${2:-4}" ;;
load) shift; load "$@" ;;
down) down ;;
kubeconfig) echo "$kubeconfig" ;;
*) sed -n '2,17p' "$0" >&2; exit 2 ;;
esac
