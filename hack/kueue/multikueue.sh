# The MultiKueue scenario of hack/kueue-e2e.sh, sourced by it: a ZayaTrainingJob with
# spec.managedBy kueue.x-k8s.io/multikueue in the manager cluster (Kueue with MultiKueue, the
# operator making only the job's Workload) runs in a worker cluster (its own Kueue and
# operator, which adopts MultiKueue's prebuilt Workload); MultiKueue copies the status back
# and finishes the manager's Workload, whose finalizer the operator then lets go.
# shellcheck shell=bash

worker_cluster=${ZAYA_CLUSTER}-w
worker_webhook_port=$((webhook_port + 1))
worker_health_port=$((health_port + 1))
worker_kueue_pid=
worker_operator_pid=
kw=

# kw_kubectl: kubectl against the worker cluster.
kw_kubectl() { KUBECONFIG=$kw kubectl "$@"; }

start_worker() {
	step "worker cluster $worker_cluster: Kueue (webhooks on :$worker_webhook_port) and the operator"
	# kwokctl adds each cluster it makes to $KUBECONFIG and switches its current context: a
	# scratch file keeps the manager's kubeconfig the manager's.
	kw=$(KUBECONFIG=$work/kwokctl-scratch.yaml ZAYA_CLUSTER=$worker_cluster "$root/hack/cluster.sh" up 2)
	(
		export KUBECONFIG=$kw
		work=$work/worker webhook_port=$worker_webhook_port
		mkdir -p "$work"
		install_kueue_api
		install_crd
	)
	local config=$work/worker/config.yaml
	sed -e "s|@CERT_DIR@|$certs|" -e "s|@WEBHOOK_PORT@|$worker_webhook_port|" \
		-e "s|@HEALTH_PORT@|$worker_health_port|" "$assets/config-workload.yaml" >"$config"
	KUBECONFIG=$kw "$kueue_bin" --config="$config" --zap-log-level="${KUEUE_LOG_LEVEL:-2}" >"$work/kueue-worker.log" 2>&1 &
	worker_kueue_pid=$!
	wait_for 90 "the worker's Kueue" eval '(KUBECONFIG=$kw health_port=$worker_health_port kueue_serves)'
	kw_kubectl apply -f "$assets/queues.yaml" >/dev/null
	kw_kubectl apply -f - >/dev/null <<-YAML
		apiVersion: kueue.x-k8s.io/v1beta2
		kind: LocalQueue
		metadata: {name: mk, namespace: $ns}
		spec: {clusterQueue: mi300x}
	YAML
	"$bin/zaya-operator" --kubeconfig "$kw" --metrics-bind-address=0 --health-probe-bind-address=0 \
		--kueue-workloads --progress-poll-interval=0 >"$work/operator-worker.log" 2>&1 &
	worker_operator_pid=$!
}

stop_worker() {
	local pid
	for pid in $worker_operator_pid $worker_kueue_pid; do
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	worker_operator_pid= worker_kueue_pid=
	if [ -n "$kw" ] && [ "${KEEP_CLUSTER:-}" != 1 ]; then
		KUBECONFIG=$work/kwokctl-scratch.yaml ZAYA_CLUSTER=$worker_cluster "$root/hack/cluster.sh" down >/dev/null 2>&1 || true
	fi
}

# manager_queues: ClusterQueue mk whose admission check is MultiKueue, dispatching to the
# worker cluster (its kubeconfig in a Secret, as MultiKueue reads it), and LocalQueue mk.
manager_queues() {
	# MultiKueue takes only inline credentials (no file paths): the kubeconfig flattened.
	kw_kubectl config view --raw --flatten --minify >"$work/worker-kubeconfig.yaml"
	kubectl create secret generic worker1 -n kueue-system --from-file=kubeconfig="$work/worker-kubeconfig.yaml" \
		--dry-run=client -o yaml | kubectl apply -f - >/dev/null
	kubectl apply -f - >/dev/null <<-YAML
		apiVersion: kueue.x-k8s.io/v1beta2
		kind: MultiKueueCluster
		metadata: {name: worker1}
		spec: {clusterSource: {kubeConfig: {locationType: Secret, location: worker1}}}
		---
		apiVersion: kueue.x-k8s.io/v1beta2
		kind: MultiKueueConfig
		metadata: {name: mk}
		spec: {clusters: [worker1]}
		---
		apiVersion: kueue.x-k8s.io/v1beta2
		kind: AdmissionCheck
		metadata: {name: multikueue}
		spec:
		  controllerName: kueue.x-k8s.io/multikueue
		  parameters: {apiGroup: kueue.x-k8s.io, kind: MultiKueueConfig, name: mk}
	YAML
	wait_for 60 "MultiKueueCluster worker1 Active" eval '[ "$(kubectl get multikueuecluster worker1 -o jsonpath="{.status.conditions[?(@.type==\"Active\")].status}")" = True ]'
	queue mk mi300x multikueue
}

multikueue_scenarios() {
	start_worker
	manager_queues
	start_operator "$work/operator-multikueue.log" --kueue-workloads --progress-poll-interval=0
	kubectl apply -f - >/dev/null <<-YAML
		apiVersion: training.zaya.dev/v1alpha1
		kind: ZayaTrainingJob
		metadata: {name: far, namespace: $ns, labels: {kueue.x-k8s.io/queue-name: mk}}
		spec:
		  nodes: 2
		  managedBy: kueue.x-k8s.io/multikueue
		  faultTolerance: {restartMode: Recreate}
		  template:
		    spec:
		      terminationGracePeriodSeconds: 1
		      containers: [{name: worker, image: zaya-worker:kueue-e2e}]
	YAML
	wait_for 30 "the manager's Workload for job far" has_wl far
	local m_wl w_wl
	m_wl=$(wl far)
	wait_for 90 "job far copied to the worker cluster" eval 'kw_kubectl get ztj -n "$ns" far >/dev/null 2>&1'
	wait_for 60 "the worker's job far adopting MultiKueue's Workload" eval '[ "$(kw_kubectl get workload -n "$ns" "$m_wl" -o jsonpath="{.metadata.ownerReferences[0].kind}")" = ZayaTrainingJob ]'
	wait_for 90 "job far running in the worker cluster" eval '(KUBECONFIG=$kw running far 2)'
	wait_for 60 "job far's status copied to the manager" eval '[ "$(kubectl get ztj -n "$ns" far -o jsonpath="{.status.readyNodes}")" = 2 ]'
	no_pods far || die "the manager cluster got pods of a job MultiKueue runs elsewhere"
	[ "$(kw_kubectl get workloads -n "$ns" -o name | wc -l)" = 1 ] || die "the worker's operator made a Workload of its own"
	w_wl=$m_wl
	# Rank 0 finishes in the worker cluster: the job succeeds there, then here.
	local pod t
	pod=$(kw_kubectl get pods -n "$ns" -l training.zaya.dev/job-name=far,training.zaya.dev/rank=0 -o jsonpath='{.items[0].metadata.name}')
	t=$(date -u +%FT%TZ)
	kw_kubectl patch pod -n "$ns" "$pod" --subresource=status --type=merge -p "{\"status\":{\"phase\":\"Succeeded\",\"containerStatuses\":[{\"name\":\"worker\",\"image\":\"zaya-worker:kueue-e2e\",\"imageID\":\"\",\"ready\":false,\"restartCount\":0,\"state\":{\"terminated\":{\"exitCode\":0,\"reason\":\"Completed\",\"startedAt\":\"$t\",\"finishedAt\":\"$t\"}}}]}}" >/dev/null
	wait_for 60 "job far Succeeded in the worker cluster" eval '(KUBECONFIG=$kw condition far Succeeded)'
	wait_for 90 "job far Succeeded in the manager cluster" condition far Succeeded
	wait_for 90 "the manager's Workload $m_wl finished and let go" eval '[ "$(wl_condition "$m_wl" Finished)" = True ] && [ -z "$(kubectl get workload -n "$ns" "$m_wl" -o jsonpath="{.metadata.finalizers}")" ]'
	pass "multikueue" "managedBy multikueue: Workload $m_wl here, job and adopted Workload $w_wl in the worker, 2 ranks ran there, none here; status copied back, Succeeded, Workload finished and let go"
	stop_operator
	stop_worker
}
