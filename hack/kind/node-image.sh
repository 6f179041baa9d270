#!/usr/bin/env bash
# hack/kind/node-image.sh: builds the kind node image for KUBE_VERSION where nothing can be
# pulled, and prints its name (zaya-kind-node:<KUBE_VERSION>-<key>). Three steps, each skipped
# when its key (a hash of its inputs: scripts, Dockerfiles, versions, binaries) was built:
#   1. the Debian base (hack/kind/debian-base.sh: debootstrap + docker import);
#   2. the images kubeadm runs, saved as one tarball (bin/kind-image/components-<key>.tar):
#      kube-apiserver, kube-controller-manager, kube-scheduler and etcd on the Debian base
#      (they link glibc), kube-proxy there with iptables and conntrack, pause (kubeadm's
#      pause.c, static) and CoreDNS (static) FROM scratch;
#   3. the node (hack/kind/node/Dockerfile): kind's base image recipe on the Debian base, with
#      kind's own files taken from the kind module, Debian's containerd, runc and CNI plugins,
#      kubelet, kubeadm and kubectl, and the tarball, imported at boot.
# The binaries come from hack/tools.sh kind (run first; quick when they are built).
#   KIND_NODE_BASE=debian:bookworm-slim   use a public base instead of step 1 (needs a registry)
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
# shellcheck source=hack/tools/versions.env
source "$root/hack/tools/versions.env"
here=$root/hack/kind
work=$bin/kind-image
log() { echo "node-image: $*" >&2; }
# hardlink SRC... DIR: a build context without copying hundreds of MB (same disk as bin/).
hardlink() { local d=${*: -1} f; for f in "${@:1:$#-1}"; do ln -f "$f" "$d/" 2>/dev/null || cp -f "$f" "$d/"; done; }

command -v docker >/dev/null && docker info >/dev/null 2>&1 || { log "no Docker engine reachable"; exit 1; }
# pause is C, linked static: gcc and glibc's static library (libc6-dev), as cgo builds need anyway.
command -v gcc >/dev/null || { log "gcc is required (Debian: apt-get install gcc libc6-dev)"; exit 1; }
"$root/hack/tools.sh" kind >&2
mkdir -p "$work"

# The images kubeadm KUBE_VERSION will run: the pause and CoreDNS tags come from it; etcd is
# ours (ETCD_VERSION, kubeadm is told its tag in hack/kind/cluster.sh).
wanted=$("$bin/kubeadm" config images list --kubernetes-version "$KUBE_VERSION" 2>/dev/null)
pause_image=$(grep '/pause:' <<<"$wanted")
coredns_image=$(grep '/coredns:' <<<"$wanted")
[ "${coredns_image##*:}" = "$COREDNS_VERSION" ] || {
	log "kubeadm $KUBE_VERSION deploys $coredns_image but COREDNS_VERSION is $COREDNS_VERSION (hack/tools/versions.env)"
	exit 1
}
etcd_image=registry.k8s.io/etcd:${ETCD_VERSION#v}-0
# moddir MODULE@VERSION: the module's folder in the module cache, downloaded if need be.
moddir() { (cd / && go mod download -json "$1") | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'; }
k8s_dir=$(moddir "k8s.io/kubernetes@$KUBE_VERSION")
kind_dir=$(moddir "sigs.k8s.io/kind@$KIND_VERSION")
[ -d "$k8s_dir" ] && [ -d "$kind_dir" ] || { log "cannot download the kubernetes or kind module"; exit 1; }
pause_c=$k8s_dir/build/pause/linux/pause.c

if [ -n "${KIND_NODE_BASE:-}" ]; then
	base=$KIND_NODE_BASE
	docker image inspect "$base" >/dev/null 2>&1 || docker pull "$base" >&2
else
	base=$("$here/debian-base.sh")
fi
base_id=$(docker image inspect -f '{{.Id}}' "$base")

# dbuild DOCKERFILE CONTEXT IMAGE [BUILD-ARG...]: a quiet build; the log only on failure.
dbuild() {
	local file=$1 context=$2 image=$3 a; shift 3
	local args=(); for a in "$@"; do args+=(--build-arg "$a"); done
	if ! docker build -f "$file" "${args[@]}" -t "$image" "$context" >"$work/build.log" 2>&1; then
		tail -40 "$work/build.log" >&2
		log "building $image failed"
		exit 1
	fi
}

# Step 2: the component tarball.
ckey=$( (echo "$KUBE_VERSION $ETCD_VERSION $COREDNS_VERSION $pause_image $base_id"; gcc --version | head -1) |
	cat - "$0" "$here"/images/* "$pause_c" \
		"$bin"/kube-apiserver "$bin"/kube-controller-manager "$bin"/kube-scheduler "$bin"/kube-proxy \
		"$bin"/etcd "$bin"/coredns | sha256sum | cut -c1-12)
components=$work/components-$ckey.tar
if [ ! -s "$components" ]; then
	log "building the component images ($KUBE_VERSION, etcd $ETCD_VERSION, CoreDNS $COREDNS_VERSION)"
	start=$SECONDS
	ctx=$work/components
	rm -rf "$ctx"
	images=()
	for c in kube-apiserver kube-controller-manager kube-scheduler etcd; do
		mkdir -p "$ctx/$c"
		hardlink "$bin/$c" "$ctx/$c"
		image=registry.k8s.io/$c:$KUBE_VERSION
		[ "$c" = etcd ] && image=$etcd_image
		dbuild "$here/images/component.Dockerfile" "$ctx/$c" "$image" "BASE=$base" "BINARY=$c"
		images+=("$image")
	done
	mkdir -p "$ctx/kube-proxy"
	hardlink "$bin/kube-proxy" "$here/images/kube-proxy-wrapper" "$ctx/kube-proxy"
	dbuild "$here/images/kube-proxy.Dockerfile" "$ctx/kube-proxy" "registry.k8s.io/kube-proxy:$KUBE_VERSION" "BASE=$base"
	images+=("registry.k8s.io/kube-proxy:$KUBE_VERSION")
	mkdir -p "$ctx/pause"
	gcc -Os -static -DVERSION="${pause_image##*:}" -o "$ctx/pause/pause" "$pause_c"
	strip "$ctx/pause/pause"
	dbuild "$here/images/pause.Dockerfile" "$ctx/pause" "$pause_image"
	images+=("$pause_image")
	mkdir -p "$ctx/coredns"
	hardlink "$bin/coredns" "$ctx/coredns"
	dbuild "$here/images/coredns.Dockerfile" "$ctx/coredns" "$coredns_image"
	images+=("$coredns_image")
	# One tarball: the layers they share (the Debian base) are stored once.
	docker save "${images[@]}" -o "$components.tmp"
	chmod 0644 "$components.tmp"
	mv "$components.tmp" "$components"
	# The registry.k8s.io names stay out of the host's image list: the tarball is the cache.
	docker rmi "${images[@]}" >/dev/null
	rm -rf "$ctx"
	find "$work" -maxdepth 1 -name 'components-*.tar' ! -name "${components##*/}" -delete
	log "component images: $(du -m "$components" | cut -f1) MB tarball in $((SECONDS - start))s"
fi

# Step 3: the node image.
nodefiles=$(find "$here/node" -type f | sort)
# shellcheck disable=SC2086
nkey=$( (echo "$KUBE_VERSION $KIND_VERSION $pause_image $base_id $ckey"; stat -c '%n %a' $nodefiles; cat $nodefiles) |
	cat - "$0" "$bin"/kubelet "$bin"/kubeadm "$bin"/kubectl | sha256sum | cut -c1-12)
node=zaya-kind-node:$KUBE_VERSION-$nkey
if ! docker image inspect "$node" >/dev/null 2>&1; then
	log "building $node (kind $KIND_VERSION recipe on $base)"
	start=$SECONDS
	ctx=$work/node
	rm -rf "$ctx"
	mkdir -p "$ctx/bin" "$ctx/images"
	# kind's files come read-only from the module cache: scripts 0755, the rest 0644, as kind's
	# own Dockerfile sets them.
	cp -r "$kind_dir/images/base/files" "$ctx/kind"
	chmod -R u+w "$ctx/kind"
	find "$ctx/kind" -type d -exec chmod 0755 {} +
	find "$ctx/kind" -type f -exec chmod 0644 {} +
	chmod 0755 "$ctx"/kind/usr/local/bin/* "$ctx"/kind/kind/bin/*
	cp -r "$here/node/rootfs" "$ctx/zaya"
	hardlink "$bin/kubelet" "$bin/kubeadm" "$bin/kubectl" "$ctx/bin"
	hardlink "$components" "$ctx/images"
	echo "$KUBE_VERSION" >"$ctx/version"
	dbuild "$here/node/Dockerfile" "$ctx" "$node" "BASE=$base" "PAUSE_IMAGE=$pause_image" "KUBE_VERSION=$KUBE_VERSION"
	rm -rf "$ctx"
	# Earlier node images of this version are stale; those a cluster still runs stay.
	docker images --format '{{.Repository}}:{{.Tag}}' zaya-kind-node | grep -F ":$KUBE_VERSION-" | grep -vxF "$node" |
		xargs -r docker rmi >/dev/null 2>&1 || true
	log "$node built in $((SECONDS - start))s, $(docker image inspect -f '{{.Size}}' "$node" | awk '{printf "%.0f MB", $1/1e6}')"
fi
echo "$node"
