#!/usr/bin/env bash
# hack/images.sh: builds the project's images where nothing can be pulled.
#   hack/images.sh [all|operator|worker|device-plugin|pytorch]...   (default: all: not pytorch)
# Every binary is static (CGO_ENABLED=0), built here with the Go build cache into
# bin/image/<image>/, which is each image's whole build context; the bases are made here:
# scratch for the operator and the device plugin, a busybox base from Debian's busybox-static
# for the worker (its heartbeat probe runs sh, date and stat). With PUBLIC_BASES=1 the
# Dockerfiles' own public bases are used instead (distroless, Debian slim), as users with a
# registry build them. Images are named $ZAYA_IMAGE_PREFIX<name>:$ZAYA_IMAGE_TAG (default
# no prefix, tag dev; e.g. ZAYA_IMAGE_PREFIX=us.icr.io/zaya/ for a push) and carry the
# version and git revision as OCI labels.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
tag=${ZAYA_IMAGE_TAG:-dev}
prefix=${ZAYA_IMAGE_PREFIX:-}
version=$(git -C "$root" describe --tags --always --dirty 2>/dev/null || echo dev)
revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
ctx=$bin/image
log() { echo "images: $*" >&2; }

command -v docker >/dev/null && docker info >/dev/null 2>&1 || { log "no Docker engine reachable"; exit 1; }

# gobuild DIR NAME=PKG...: static binaries into $ctx/DIR.
gobuild() {
	local dir=$ctx/$1 p; shift
	mkdir -p "$dir"
	for p in "$@"; do
		(cd "$root" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$dir/${p%%=*}" "${p#*=}")
	done
}

# dbuild DOCKERFILE CONTEXT IMAGE [BUILD-ARG...]
dbuild() {
	local file=$1 context=$2 image=$3; shift 3
	local args=(--build-arg "VERSION=$version" --build-arg "REVISION=$revision")
	local a; for a in "$@"; do args+=(--build-arg "$a"); done
	docker build -q -f "$file" "${args[@]}" -t "$image" "$context" >/dev/null
	log "$image $(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.1f MB", $1/1e6}')"
}

# busybox_base: prints the tag of the busybox base, built once per busybox binary.
busybox_base() {
	local bb=/bin/busybox
	if ! dpkg -s busybox-static >/dev/null 2>&1; then
		log "installing Debian's busybox-static"
		apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq busybox-static >/dev/null
	fi
	local key; key=$(cat "$bb" "$root/hack/images/busybox.Dockerfile" | sha256sum | cut -c1-12)
	local image=zaya-base-busybox:$key
	if ! docker image inspect "$image" >/dev/null 2>&1; then
		local d; d=$(mktemp -d)
		cp "$bb" "$d/busybox"
		docker build -q -f "$root/hack/images/busybox.Dockerfile" -t "$image" "$d" >/dev/null
		rm -rf "$d"
		log "$image (busybox base) built"
	fi
	echo "$image"
}

build_operator() {
	gobuild operator zaya-operator=.
	local base=BASE=scratch; [ "${PUBLIC_BASES:-}" = 1 ] && base=
	dbuild "$root/Dockerfile" "$ctx/operator" "${prefix}zaya-operator:$tag" $base
}

build_worker() {
	gobuild worker zaya-worker=./workers/cmd/zaya-worker zaya-supervisor=./workers/cmd/zaya-supervisor
	local base; [ "${PUBLIC_BASES:-}" = 1 ] || base=BASE=$(busybox_base)
	dbuild "$root/workers/Dockerfile" "$ctx/worker" "${prefix}zaya-worker:$tag" ${base:-}
}

# build_pytorch: Debian's CPU PyTorch for examples/pytorch (make test-kind's PyTorch test);
# not in "all": its install is 150 MB from Debian's mirror, cached in a layer once made.
build_pytorch() {
	local base; [ "${PUBLIC_BASES:-}" = 1 ] || base=BASE=$("$root/hack/kind/debian-base.sh")
	dbuild "$root/examples/pytorch/Dockerfile.cpu" "$root/examples/pytorch" "${prefix}zaya-pytorch:$tag" ${base:-}
}

build_device_plugin() {
	gobuild device-plugin amd-fake-device-plugin=./test/fakedeviceplugin/cmd/amd-fake-device-plugin
	dbuild "$root/test/fakedeviceplugin/Dockerfile" "$ctx/device-plugin" "${prefix}zaya-fake-device-plugin:$tag"
}

[ $# -gt 0 ] || set -- all
for t in "$@"; do
	case $t in
	all) build_operator; build_worker; build_device_plugin ;;
	operator) build_operator ;;
	worker) build_worker ;;
	device-plugin) build_device_plugin ;;
	pytorch) build_pytorch ;;
	*) log "unknown image $t"; exit 2 ;;
	esac
done
