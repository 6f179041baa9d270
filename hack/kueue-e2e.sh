#!/usr/bin/env bash
# ZayaTrainingJobs under a real Kueue on the local cluster of fake MI300X nodes (hack/cluster.sh).
# Kueue's manager is built from a source checkout and runs as a plain process outside the
# cluster, as the operator does in hack/e2e.sh: its webhooks (admission and the CRD conversion
# webhook) are reached at https://127.0.0.1:$KUEUE_WEBHOOK_PORT with a throwaway CA made here,
# not through a Service.
#   KUEUE_SRC=/path/to/kueue hack/kueue-e2e.sh [workload|podgroup|multikueue|all]   (default all)
# workload: Kueue config hack/kueue/config-workload.yaml (pod integration + ZayaTrainingJob as an
#   external framework); podgroup: hack/kueue/config-podgroup.yaml (pod integration only);
#   multikueue: hack/kueue/config-multikueue.yaml in this cluster, dispatching to a second
#   (worker) cluster with its own Kueue and operator (hack/kueue/multikueue.sh);
#   all: each in turn, restarting Kueue in between. Scenarios: hack/kueue/scenarios.sh.
# KUEUE_SRC  a Kueue v0.19.x checkout (required: its CRDs and webhook manifests are applied).
# KUEUE_BIN  a manager binary to use instead of building one (default: bin/kueue-<commit>).
# KEEP_CLUSTER=1 leaves the cluster running (Kueue stopped, its webhooks removed).
# ZAYA_CLUSTER (default zaya-kueue), KUEUE_E2E_NODES (4), KUEUE_WEBHOOK_PORT (9443),
# KUEUE_HEALTH_PORT (18081), KUEUE_LOG_LEVEL (Kueue's --zap-log-level, default 2).
# Logs and generated files: bin/kueue-e2e/ (Kueue's log: bin/kueue-e2e/kueue.log).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export ZAYA_CLUSTER=${ZAYA_CLUSTER:-zaya-kueue}
nodes=${KUEUE_E2E_NODES:-4}
webhook_port=${KUEUE_WEBHOOK_PORT:-9443}
health_port=${KUEUE_HEALTH_PORT:-18081}
assets="$root/hack/kueue"
work="$bin/kueue-e2e"
certs="$work/certs"
kueue_log="$work/kueue.log"
# The namespaces Kueue never manages: managedJobsNamespaceSelector in hack/kueue/config-*.yaml
# and the namespaceSelector given here to its job webhooks (as Kueue's own kustomization does).
system_namespaces='["kube-system", "kueue-system"]'
kueue_pid=
kueue_variant=

kubectl() { "$bin/kubectl" "$@"; }
step() { printf '\n== kueue-e2e: %s\n' "$*" >&2; }
die() {
	echo "kueue-e2e: $*" >&2
	exit 1
}

# wait_for SECONDS WHAT COMMAND...: runs COMMAND every half second until it succeeds.
wait_for() {
	local limit=$1 what=$2 end=$((SECONDS + $1))
	shift 2
	until "$@"; do
		[ "$SECONDS" -lt "$end" ] || {
			echo "kueue-e2e: no $what within ${limit}s" >&2
			return 1
		}
		sleep 0.5
	done
}

# build_kueue: sets kueue_bin, building KUEUE_SRC's ./cmd/kueue into bin/kueue-<commit> unless
# that is there already (a tree with local changes is rebuilt every time: Go's cache keeps that
# quick).
build_kueue() {
	[ -n "${KUEUE_SRC:-}" ] || die "set KUEUE_SRC to a Kueue v0.19.x source checkout"
	[ -f "$KUEUE_SRC/cmd/kueue/main.go" ] || die "KUEUE_SRC=$KUEUE_SRC has no cmd/kueue"
	KUEUE_SRC=$(cd "$KUEUE_SRC" && pwd)
	local version commit suffix=
	version=$(git -C "$KUEUE_SRC" describe --tags --always 2>/dev/null || echo unknown)
	commit=$(git -C "$KUEUE_SRC" rev-parse HEAD 2>/dev/null || echo nogit)
	case $version in
	v0.19.*) ;;
	*) echo "kueue-e2e: warning: KUEUE_SRC is Kueue $version; this script is written for v0.19.x" >&2 ;;
	esac
	if [ -n "${KUEUE_BIN:-}" ]; then
		kueue_bin=$KUEUE_BIN
		return
	fi
	if [ "$commit" = nogit ] || [ -n "$(git -C "$KUEUE_SRC" status --porcelain --untracked-files=no)" ]; then
		suffix=-dirty
	fi
	kueue_bin="$bin/kueue-$commit$suffix"
	[ -z "$suffix" ] && [ -x "$kueue_bin" ] && return
	step "building Kueue $version ($commit$suffix) from $KUEUE_SRC: minutes the first time"
	local start=$SECONDS
	(cd "$KUEUE_SRC" && go build -o "$kueue_bin.tmp" -ldflags \
		"-X sigs.k8s.io/kueue/pkg/version.GitVersion=$version -X sigs.k8s.io/kueue/pkg/version.GitCommit=$commit" \
		./cmd/kueue)
	mv "$kueue_bin.tmp" "$kueue_bin"
	echo "kueue-e2e: built $kueue_bin in $((SECONDS - start))s" >&2
}

# make_certs: a CA and a serving certificate for 127.0.0.1/localhost in $certs (tls.crt and
# tls.key, the names controller-runtime's webhook server loads); sets ca_bundle.
make_certs() {
	rm -rf "$certs"
	mkdir -p "$certs"
	local ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
	openssl req -x509 "${ec[@]}" -days 7 -subj /CN=kueue-e2e-ca \
		-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
		-keyout "$certs/ca.key" -out "$certs/ca.crt" 2>/dev/null
	openssl req "${ec[@]}" -subj /CN=127.0.0.1 -keyout "$certs/tls.key" -out "$certs/tls.csr" 2>/dev/null
	printf '%s\n' subjectAltName=IP:127.0.0.1,DNS:localhost extendedKeyUsage=serverAuth \
		keyUsage=critical,digitalSignature basicConstraints=CA:FALSE >"$certs/ext.cnf"
	openssl x509 -req -in "$certs/tls.csr" -CA "$certs/ca.crt" -CAkey "$certs/ca.key" \
		-CAcreateserial -days 7 -extfile "$certs/ext.cnf" -out "$certs/tls.crt" 2>/dev/null
	ca_bundle=$(base64 -w0 <"$certs/ca.crt")
}

# metrics_certs: with internalCertManagement off, Kueue v0.19 loads a metrics certificate from
# the fixed path /etc/kueue/metrics/certs (cmd/kueue/main.go) at start and exits without one,
# even with its metrics server off. Any certificate will do: one is made there once.
metrics_certs() {
	local dir=/etc/kueue/metrics/certs
	[ -s "$dir/tls.crt" ] && [ -s "$dir/tls.key" ] && return
	mkdir -p "$dir" 2>/dev/null &&
		openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
			-subj /CN=kueue-metrics -keyout "$dir/tls.key" -out "$dir/tls.crt" 2>/dev/null ||
		die "Kueue needs $dir/tls.crt and tls.key (any self-signed pair); could not create them here (not root?)"
}

# install_kueue_api: the kueue-system namespace, Kueue's CRDs and its webhook configurations,
# all pointing at https://127.0.0.1:$webhook_port with $ca_bundle.
install_kueue_api() {
	local url="https://127.0.0.1:$webhook_port" conversion
	kubectl create namespace kueue-system --dry-run=client -o yaml | kubectl apply -f - >/dev/null
	# The CRDs whose conversion webhook Kueue's kustomization turns on (patches/webhook_in_*).
	conversion=$(sed -n 's|^- path: patches/webhook_in_\(.*\)\.yaml$|"\1.kueue.x-k8s.io"|p' \
		"$KUEUE_SRC/config/components/crd/kustomization.yaml" | paste -sd, -)
	# shellcheck disable=SC2016 # the $names in single quotes are jq variables
	kubectl create --dry-run=client -o json -f "$KUEUE_SRC/config/components/crd/bases" |
		jq --arg url "$url/convert" --arg ca "$ca_bundle" --argjson conv "[$conversion]" '
			{apiVersion: "v1", kind: "List", items: (if .kind == "List" then .items else [.] end | map(
				. as $crd
				| if any($conv[]; . == $crd.metadata.name) then
					.spec.conversion = {strategy: "Webhook", webhook: {
						clientConfig: {url: $url, caBundle: $ca}, conversionReviewVersions: ["v1"]}}
				else . end))}' >"$work/crds.json"
	kubectl apply --server-side --force-conflicts -f "$work/crds.json" >/dev/null
	kubectl wait --for=condition=Established --timeout=60s -f "$work/crds.json" >/dev/null
	# Webhook configurations: service references become URLs; the job webhooks (every one
	# outside kueue.x-k8s.io) skip the system namespaces, as in Kueue's release manifests.
	# shellcheck disable=SC2016
	kubectl create --dry-run=client -o json -f "$KUEUE_SRC/config/components/webhook/manifests.yaml" |
		jq --arg url "$url" --arg ca "$ca_bundle" --argjson ns "$system_namespaces" '
			{apiVersion: "v1", kind: "List", items: (if .kind == "List" then .items else [.] end | map(
				.metadata.name = "kueue-" + .metadata.name
				| .webhooks |= map(
					.clientConfig = {url: ($url + .clientConfig.service.path), caBundle: $ca}
					| if any(.rules[].apiGroups[]; . == "kueue.x-k8s.io") then . else
						.namespaceSelector = {matchExpressions: [
							{key: "kubernetes.io/metadata.name", operator: "NotIn", values: $ns}]}
					end)))}' >"$work/webhooks.json"
	kubectl apply -f "$work/webhooks.json" >/dev/null
}

# kueue_identity: Kueue runs as its service account would in the cluster: its release RBAC and,
# on ZayaTrainingJobs, only config/kueue/kueue_access_role.yaml (what docs/kueue.md grants), so
# a grant that falls short fails the run. Writes the kubeconfig Kueue uses: the admin's,
# impersonating kueue-system/kueue-controller-manager.
kueue_identity() {
	local dir="$work/rbac"
	mkdir -p "$dir"
	cat >"$dir/kustomization.yaml" <<-YAML
		namespace: kueue-system
		namePrefix: kueue-
		resources:
		- $(realpath --relative-to="$dir" "$KUEUE_SRC/config/components/rbac")
	YAML
	kubectl kustomize --load-restrictor LoadRestrictionsNone "$dir" >"$dir/kueue-rbac.yaml"
	kubectl apply --server-side --force-conflicts -f "$dir/kueue-rbac.yaml" >/dev/null
	kubectl apply -f "$root/config/kueue/kueue_access_role.yaml" >/dev/null
	# shellcheck disable=SC2016
	kubectl config view --raw --minify -o json | jq '.users[0].user += {
		as: "system:serviceaccount:kueue-system:kueue-controller-manager",
		"as-groups": ["system:serviceaccounts", "system:serviceaccounts:kueue-system", "system:authenticated"]}' \
		>"$work/kueue-kubeconfig.yaml"
}

# kueue_serves: Kueue is ready and its webhooks answer through the API server: a server-side
# dry run of a ClusterQueue passes its mutating and validating webhooks, one of a v1beta1
# LocalQueue its conversion webhook (stored as v1beta2).
kueue_serves() {
	curl -fsS "http://127.0.0.1:$health_port/readyz" >/dev/null 2>&1 || return 1
	kubectl create --dry-run=server -f - >/dev/null 2>&1 <<-EOF || return 1
		apiVersion: kueue.x-k8s.io/v1beta2
		kind: ClusterQueue
		metadata: {name: kueue-e2e-probe}
		spec: {namespaceSelector: {}}
		---
		apiVersion: kueue.x-k8s.io/v1beta1
		kind: LocalQueue
		metadata: {name: kueue-e2e-probe, namespace: default}
		spec: {clusterQueue: kueue-e2e-probe}
	EOF
}

# start_kueue workload|podgroup: runs Kueue with hack/kueue/config-VARIANT.yaml in the
# background (log appended to bin/kueue-e2e/kueue.log) and waits until its webhooks answer.
start_kueue() {
	local variant=$1 config="$work/config-$1.yaml"
	[ -f "$assets/config-$variant.yaml" ] || die "no Kueue config variant '$variant'"
	stop_kueue
	sed -e "s|@CERT_DIR@|$certs|" -e "s|@WEBHOOK_PORT@|$webhook_port|" \
		-e "s|@HEALTH_PORT@|$health_port|" "$assets/config-$variant.yaml" >"$config"
	step "starting Kueue ($variant path; log: ${kueue_log#"$root"/})"
	echo "===== kueue-e2e: $(date -u +%FT%TZ) starting Kueue, $variant path, $config" >>"$kueue_log"
	KUBECONFIG="$work/kueue-kubeconfig.yaml" "$kueue_bin" --config="$config" --zap-log-level="${KUEUE_LOG_LEVEL:-2}" \
		>>"$kueue_log" 2>&1 &
	kueue_pid=$!
	kueue_variant=$variant
	local end=$((SECONDS + 90))
	until kueue_serves; do
		kill -0 "$kueue_pid" 2>/dev/null || die "Kueue exited at start: $(tail -5 "$kueue_log")"
		[ "$SECONDS" -lt "$end" ] || die "Kueue's webhooks did not answer within 90s"
		sleep 0.5
	done
}

# stop_kueue: ends the Kueue started by start_kueue, if any. Its webhooks stay registered and
# fail closed: pods in LocalQueues cannot be created until Kueue runs again.
stop_kueue() {
	[ -n "$kueue_pid" ] || return 0
	kill "$kueue_pid" 2>/dev/null || true
	wait "$kueue_pid" 2>/dev/null || true
	echo "===== kueue-e2e: $(date -u +%FT%TZ) stopped Kueue ($kueue_variant path)" >>"$kueue_log"
	kueue_pid=
	kueue_variant=
}

# install_queues: ResourceFlavor mi300x, ClusterQueue mi300x (16 GPUs), LocalQueue default/team.
install_queues() {
	kubectl apply -f "$assets/queues.yaml" >/dev/null
	kubectl wait --for=condition=Active --timeout=30s clusterqueue/mi300x >/dev/null
	kubectl wait --for=condition=Active --timeout=30s -n default localqueue/team >/dev/null
}

# workload_of UID: the name of the Workload owned by the object with that UID.
workload_of() {
	# shellcheck disable=SC2016
	kubectl get workloads -n default -o json |
		jq -r --arg uid "$1" '.items[] | select(any(.metadata.ownerReferences[]?; .uid == $uid)) | .metadata.name'
}
has_workload() { [ -n "$(workload_of "$1")" ]; }
gone_or_finished() { # WORKLOAD
	local s
	s=$(kubectl get workload -n default "$1" --ignore-not-found \
		-o jsonpath='{.metadata.name}|{.status.conditions[?(@.type=="Finished")].status}') || return 1
	[ -z "$s" ] || [ "${s#*|}" = True ]
}
pod_ungated_ready() {
	[ "$(kubectl get pod -n default "$1" -o jsonpath='{.spec.schedulingGates}{"|"}{.status.conditions[?(@.type=="Ready")].status}')" = "|True" ]
}
cq_empty() {
	[ "$(kubectl get clusterqueue mi300x -o jsonpath='{.status.admittedWorkloads}')" = 0 ]
}

# smoke_pod: Kueue's pod path end to end: a plain pod in LocalQueue team is gated by the
# webhook, gets a Workload that is admitted, is ungated, runs (kwok) and is Ready (PodsReady);
# deleting it finishes the Workload and frees the quota.
smoke_pod() {
	step "smoke: a plain pod in LocalQueue team goes through Kueue's pod webhook and is admitted"
	local created gates uid wl
	kubectl delete pod -n default kueue-smoke --ignore-not-found --wait=true >/dev/null
	created=$(kubectl create -f "$assets/smoke-pod.yaml" -o json)
	gates=$(jq -r '[.spec.schedulingGates[]?.name] | join(",")' <<<"$created")
	[[ ,$gates, == *,kueue.x-k8s.io/admission,* ]] ||
		die "the pod was created without Kueue's kueue.x-k8s.io/admission gate (gates: '$gates')"
	echo "created with scheduling gates: $gates"
	uid=$(jq -r .metadata.uid <<<"$created")
	wait_for 30 "Workload for pod kueue-smoke" has_workload "$uid"
	wl=$(workload_of "$uid")
	kubectl wait -n default --for=condition=Admitted --timeout=30s "workload/$wl" >/dev/null
	wait_for 30 "ungated, Ready pod kueue-smoke" pod_ungated_ready kueue-smoke
	kubectl wait -n default --for=condition=PodsReady --timeout=30s "workload/$wl" >/dev/null
	kubectl get pod -n default kueue-smoke -o wide
	kubectl get workload -n default "$wl" \
		-o custom-columns='WORKLOAD:.metadata.name,QUEUE:.spec.queueName,ADMITTED-BY:.status.admission.clusterQueue,FLAVOR:.status.admission.podSetAssignments[0].flavors.amd\.com/gpu'
	kubectl delete pod -n default kueue-smoke --wait=true >/dev/null
	wait_for 30 "finished Workload $wl" gone_or_finished "$wl"
	wait_for 30 "empty ClusterQueue mi300x" cq_empty
	# A finished Workload outlives its pod; a later pod of the same name would find it first.
	kubectl delete workload -n default "$wl" --ignore-not-found >/dev/null
	echo "smoke passed: gated, Workload $wl admitted, ungated, PodsReady, finished, quota freed"
}

# scenarios VARIANT: the scenarios of hack/kueue/scenarios.sh for the path (workload|podgroup),
# with Kueue up on that path, the queues installed, our CRD installed and KUBECONFIG exported.
# shellcheck source=hack/kueue/scenarios.sh
source "$assets/scenarios.sh"
# shellcheck source=hack/kueue/multikueue.sh
source "$assets/multikueue.sh"
passed=()
scenarios() {
	case $1 in
	workload) workload_scenarios ;;
	podgroup) podgroup_scenarios ;;
	multikueue) multikueue_scenarios ;;
	esac
	# Nothing of this path's jobs may outlive it.
	kubectl delete ztj -n "$ns" --all --wait=false >/dev/null 2>&1 || true
	wait_for 60 "no job pod left" eval '[ "$(kubectl get pods -n "$ns" -l training.zaya.dev/job-name -o name | wc -l)" = 0 ]'
}

cleanup() {
	local rc=$?
	stop_worker
	stop_operator
	stop_kueue
	if [ "$rc" -ne 0 ] && [ -s "$kueue_log" ]; then
		echo "kueue-e2e: failed; the jobs, Workloads and pods:" >&2
		show >&2
		echo "kueue-e2e: the last lines of ${kueue_log#"$root"/}:" >&2
		tail -n 30 "$kueue_log" >&2
		echo "kueue-e2e: the operators' logs: ${work#"$root"/}/operator-*.log" >&2
	fi
	if [ "${KEEP_CLUSTER:-}" = 1 ]; then
		# Without Kueue its fail-closed webhooks would refuse every queued pod.
		kubectl delete --ignore-not-found -f "$work/webhooks.json" >/dev/null 2>&1 || true
		cat >&2 <<-EOF

			KEEP_CLUSTER=1: cluster $ZAYA_CLUSTER is still running; Kueue is stopped and its webhook
			configurations removed. From $root:
			  export KUBECONFIG=${KUBECONFIG:-}
			  bin/kubectl apply -f ${work#"$root"/}/webhooks.json
			  ${kueue_bin#"$root"/} --config=${work#"$root"/}/config-workload.yaml
			Remove it: ZAYA_CLUSTER=$ZAYA_CLUSTER hack/cluster.sh down
		EOF
	else
		"$root/hack/cluster.sh" down >/dev/null 2>&1 || true
	fi
}

main() {
	local variants
	case ${1:-all} in
	workload | podgroup | multikueue) variants=("$1") ;;
	all) variants=(workload podgroup multikueue) ;;
	*)
		sed -n '2,16p' "$0" >&2
		exit 2
		;;
	esac
	mkdir -p "$work"
	: >"$kueue_log"
	"$root/hack/tools.sh" cluster
	build_kueue
	go build -o "$bin/zaya-operator" "$root"
	trap cleanup EXIT
	step "starting cluster $ZAYA_CLUSTER with $nodes fake MI300X nodes"
	KUBECONFIG=$("$root/hack/cluster.sh" up "$nodes")
	export KUBECONFIG
	step "installing Kueue's CRDs and webhooks (https://127.0.0.1:$webhook_port) and our CRD"
	make_certs
	metrics_certs
	install_kueue_api
	install_crd
	kueue_identity
	local v
	for v in "${variants[@]}"; do
		start_kueue "$v"
		install_queues
		smoke_pod
		scenarios "$v"
	done
	stop_kueue
	step "done: ${variants[*]}: ${#passed[@]} scenarios passed: ${passed[*]}"
}

main "$@"
