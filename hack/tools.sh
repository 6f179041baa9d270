#!/usr/bin/env bash
# Builds the pinned test and cluster binaries from the Go module proxy into bin/.
# Each group is rebuilt only when its stamp (Go version + pins + wrapper go.sum) changes.
#   hack/tools.sh [all|k8s|etcd|kwok|controller-gen|helm|golangci-lint|promtool|prometheus|krew|envtest|envtest-min|kind|coredns]...
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=hack/tools/versions.env
source "$root/hack/tools/versions.env"
bin="$root/bin"
mkdir -p "$bin"
gov=$(go env GOVERSION)

# fresh NAME KEY BINARY...: true when the stamp matches KEY and every binary exists.
fresh() {
	local name=$1 key=$2; shift 2
	[ "$(cat "$bin/.stamp-$name" 2>/dev/null)" = "$key" ] || return 1
	local b; for b in "$@"; do [ -x "$bin/$b" ] || return 1; done
}
stamp() { echo "$2" > "$bin/.stamp-$1"; }
hash_of() { cat "$@" | sha256sum | cut -c1-16; }
log() { echo "tools: $*" >&2; }

# k8s_build STAMP COMMAND...: Kubernetes commands of KUBE_VERSION from hack/tools/k8s.
k8s_build() {
	local name=$1; shift
	local key; key="$gov $KUBE_VERSION $(hash_of "$root/hack/tools/k8s/go.mod" "$root/hack/tools/k8s/go.sum")"
	fresh "$name" "$key" "$@" && return
	log "building kubernetes $KUBE_VERSION $* (the slow part of a cold build: README.md, \"Time and disk\")"
	local minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
	local ld="-s -w" p c
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ld+=" -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
	done
	(cd "$root/hack/tools/k8s" && for c in "$@"; do
		go build -trimpath -ldflags "$ld" -o "$bin/$c" "k8s.io/kubernetes/cmd/$c"
	done)
	stamp "$name" "$key"
}
build_k8s() { k8s_build k8s kube-apiserver kube-scheduler kube-controller-manager kubectl; }
# What a kind node runs besides the control plane (hack/kind).
build_k8s_node() { k8s_build k8s-node kubelet kubeadm kube-proxy; }

# The API server of the oldest supported Kubernetes (hack/tools/k8s-min), for envtest-min.
build_k8s_min() {
	local key; key="$gov $KUBE_MIN_VERSION $(hash_of "$root/hack/tools/k8s-min/go.mod" "$root/hack/tools/k8s-min/go.sum")"
	fresh k8s-min "$key" kube-apiserver-min && return
	log "building the kubernetes $KUBE_MIN_VERSION API server (the oldest supported)"
	local minor=${KUBE_MIN_VERSION#v1.}; minor=${minor%%.*}
	local ld="-s -w" p
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ld+=" -X $p.gitVersion=$KUBE_MIN_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
	done
	(cd "$root/hack/tools/k8s-min" && go build -trimpath -ldflags "$ld" -o "$bin/kube-apiserver-min" k8s.io/kubernetes/cmd/kube-apiserver)
	stamp k8s-min "$key"
}

build_etcd() {
	local key; key="$gov $ETCD_VERSION $(hash_of "$root/hack/tools/etcd/go.mod" "$root/hack/tools/etcd/go.sum")"
	fresh etcd "$key" etcd etcdctl && return
	log "building etcd $ETCD_VERSION"
	(cd "$root/hack/tools/etcd" &&
		go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3 &&
		go build -trimpath -ldflags "-s -w" -o "$bin/etcdctl" go.etcd.io/etcd/etcdctl/v3)
	stamp etcd "$key"
}

# install NAME VERSION PACKAGE LDFLAGS BINARY...: go install a module that builds without replaces.
install() {
	local name=$1 version=$2 pkg=$3 ld=$4; shift 4
	local key="$gov $version $ld"
	fresh "$name" "$key" "$@" && return
	log "installing $pkg@$version"
	GOBIN="$bin" go install -trimpath -ldflags "-s -w $ld" "$pkg@$version"
	stamp "$name" "$key"
}

build_kwok() {
	install kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok "" kwok
	install kwokctl "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwokctl "" kwokctl
}
build_controller_gen() { install controller-gen "$CONTROLLER_TOOLS_VERSION" sigs.k8s.io/controller-tools/cmd/controller-gen "" controller-gen; }
# helm's Makefile stamps the Kubernetes version of its client-go (1.34 for helm 3.19) into
# lint and template; without it they assume 1.20 and refuse charts that need newer.
build_helm() {
	local ld="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" p
	for p in lint/rules chartutil; do ld+=" -X helm.sh/helm/v3/pkg/$p.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/$p.k8sVersionMinor=$HELM_KUBE_MINOR"; done
	install helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm "$ld" helm
}
build_kind() { install kind "$KIND_VERSION" sigs.k8s.io/kind "" kind; }
# The cluster DNS kubeadm deploys, for the kind node image (hack/kind/node-image.sh): static,
# since its image is FROM scratch.
build_coredns() { CGO_ENABLED=0 install coredns "$COREDNS_VERSION" github.com/coredns/coredns "" coredns; }
build_promtool() { install promtool "$PROMETHEUS_VERSION" github.com/prometheus/prometheus/cmd/promtool "" promtool; }
# The Prometheus server, for hack/panels.sh only (not in all): the same module as promtool.
build_prometheus() { install prometheus "$PROMETHEUS_VERSION" github.com/prometheus/prometheus/cmd/prometheus "" prometheus; }
build_krew() { install krew "$KREW_VERSION" sigs.k8s.io/krew/cmd/krew "" krew; }
build_golangci_lint() { install golangci-lint "$GOLANGCI_LINT_VERSION" github.com/golangci/golangci-lint/v2/cmd/golangci-lint "" golangci-lint; }

# envtest wants a folder holding exactly its control-plane binaries.
envtest_assets() {
	mkdir -p "$bin/envtest"
	ln -sf ../etcd "$bin/envtest/etcd"
	ln -sf ../kube-apiserver "$bin/envtest/kube-apiserver"
	ln -sf ../kubectl "$bin/envtest/kubectl"
}
envtest_min_assets() {
	mkdir -p "$bin/envtest-min"
	ln -sf ../etcd "$bin/envtest-min/etcd"
	ln -sf ../kube-apiserver-min "$bin/envtest-min/kube-apiserver"
}

[ $# -gt 0 ] || set -- all
for t in "$@"; do
	case $t in
	all) build_controller_gen; build_etcd; build_k8s; build_k8s_min; build_kwok; build_helm; build_golangci_lint; build_promtool; build_krew; envtest_assets; envtest_min_assets ;;
	cluster) build_etcd; build_k8s; build_kwok; envtest_assets ;;
	envtest) build_etcd; build_k8s; envtest_assets ;;
	envtest-min) build_etcd; build_k8s_min; envtest_min_assets ;;
	k8s) build_k8s ;;
	kind) build_etcd; build_k8s; build_k8s_node; build_kind; build_coredns ;;
	coredns) build_coredns ;;
	etcd) build_etcd ;;
	kwok) build_kwok ;;
	controller-gen) build_controller_gen ;;
	helm) build_helm ;;
	golangci-lint) build_golangci_lint ;;
	promtool) build_promtool ;;
	krew) build_krew ;;
	prometheus) build_prometheus ;;
	*) echo "tools: unknown target $t" >&2; exit 2 ;;
	esac
done
