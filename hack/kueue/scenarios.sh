# Scenarios of hack/kueue-e2e.sh, sourced by it: ZayaTrainingJobs under a real Kueue, on each
# path (docs/kueue.md). Every check waits for a state and fails the run with what it saw.
# shellcheck shell=bash

ns=default

# ztj NAME NODES PATH [PRIORITY_CLASS [RESTART_MODE [ANNOTATIONS...]]]: applies a job in
# LocalQueue team (the label on the job for the workload path, in its template for the
# pod-group path).
ztj() {
	local name=$1 n=$2 path=$3 prio=${4:-} mode=${5:-Recreate}
	shift $(($# < 5 ? $# : 5))
	local labels="kueue.x-k8s.io/queue-name: team" job_labels="{}" tmpl_labels="{}" annotations="{}"
	[ -n "$prio" ] && labels+=", kueue.x-k8s.io/priority-class: $prio"
	if [ "$path" = workload ]; then job_labels="{$labels}"; else tmpl_labels="{$labels}"; fi
	[ $# -gt 0 ] && annotations="{$(
		IFS=,
		echo "$*"
	)}"
	kubectl apply -f - >/dev/null <<YAML
apiVersion: training.zaya.dev/v1alpha1
kind: ZayaTrainingJob
metadata:
  name: $name
  namespace: $ns
  labels: $job_labels
  annotations: $annotations
spec:
  nodes: $n
  faultTolerance: {maxRestarts: 50, restartMode: $mode, terminatingTimeout: 10s}
  template:
    metadata:
      labels: $tmpl_labels
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: worker
        image: zaya-worker:kueue-e2e
YAML
}

# running NAME N: the job has exactly N live pods, every one ungated, Running and Ready, and
# none being deleted.
running() {
	local out
	out=$(kubectl get pods -n "$ns" -l "training.zaya.dev/job-name=$1" -o json | jq -r '
		[.items[] | select(.status.phase != "Succeeded" and .status.phase != "Failed")] as $live |
		"\($live | length) \([$live[] | select(.metadata.deletionTimestamp == null and (.spec.schedulingGates // [] | length) == 0 and
			any(.status.conditions[]?; .type == "Ready" and .status == "True"))] | length)"')
	[ "$out" = "$2 $2" ]
}
# no_pods NAME: the job has no pod at all (none stuck terminating either).
no_pods() { [ "$(kubectl get pods -n "$ns" -l "training.zaya.dev/job-name=$1" -o name | wc -l)" = 0 ]; }
# no_live_pods NAME: none of the job's pods runs or waits to run.
no_live_pods() {
	[ "$(kubectl get pods -n "$ns" -l "training.zaya.dev/job-name=$1" -o json |
		jq '[.items[] | select(.status.phase != "Succeeded" and .status.phase != "Failed")] | length')" = 0 ]
}
# stuck_pods: pods of any job that are being deleted and still hold Kueue's finalizer.
stuck_pods() {
	kubectl get pods -n "$ns" -o json | jq -r '.items[] | select(.metadata.deletionTimestamp != null and
		any(.metadata.finalizers[]?; . == "kueue.x-k8s.io/managed")) | .metadata.name'
}
no_stuck_pods() { [ -z "$(stuck_pods)" ]; }
# condition NAME TYPE [REASON]: the job's condition TYPE is True (with REASON).
condition() {
	local got
	got=$(kubectl get ztj -n "$ns" "$1" -o jsonpath="{.status.conditions[?(@.type==\"$2\")].status}/{.status.conditions[?(@.type==\"$2\")].reason}")
	[ "${got%%/*}" = True ] && { [ -z "${3:-}" ] || [ "${got#*/}" = "$3" ]; }
}
# queued_says NAME TEXT: the job's Queued message holds TEXT.
queued_says() {
	[[ "$(kubectl get ztj -n "$ns" "$1" -o jsonpath='{.status.conditions[?(@.type=="Queued")].message}')" == *"$2"* ]]
}
# wl NAME: the Workload the job owns (workload path), "" if none.
wl() {
	local uid
	uid=$(kubectl get ztj -n "$ns" "$1" -o jsonpath='{.metadata.uid}')
	workload_of "$uid"
}
wl_uid() { kubectl get workload -n "$ns" "$1" -o jsonpath='{.metadata.uid}'; }
wl_condition() { # WORKLOAD TYPE → its status
	kubectl get workload -n "$ns" "$1" -o jsonpath="{.status.conditions[?(@.type==\"$2\")].status}"
}
wl_admitted() { [ "$(wl_condition "$1" Admitted)" = True ] && [ -n "$(kubectl get workload -n "$ns" "$1" -o jsonpath='{.status.admission.clusterQueue}')" ]; }
wl_queued() { [ "$(wl_condition "$1" QuotaReserved)" != True ] && [ -z "$(kubectl get workload -n "$ns" "$1" -o jsonpath='{.status.admission}')" ]; }
has_wl() { [ -n "$(wl "$1")" ]; }
attempt() { kubectl get ztj -n "$ns" "$1" -o jsonpath='{.status.restarts}'; }
attempt_above() { [ "$(attempt "$1")" -gt "$2" ]; }
gpus_in_use() { kubectl get clusterqueue mi300x -o json | jq '[.status.flavorsUsage[]?.resources[]? | select(.name == "amd.com/gpu") | .total | tonumber] | add // 0'; }
# crash NAME RANK: the rank's worker exits 1, as the kubelet would report it.
crash() {
	local pod
	pod=$(kubectl get pods -n "$ns" -l "training.zaya.dev/job-name=$1,training.zaya.dev/rank=$2" -o json |
		jq -r '[.items[] | select(.metadata.deletionTimestamp == null and .status.phase == "Running")][0].metadata.name')
	kubectl patch pod -n "$ns" "$pod" --subresource=status --type=merge -p "$(jq -cn --arg t "$(date -u +%FT%TZ)" '{status: {phase: "Failed",
		containerStatuses: [{name: "worker", image: "zaya-worker:kueue-e2e", imageID: "", ready: false, restartCount: 0,
		state: {terminated: {exitCode: 1, reason: "Error", message: "kueue-e2e: crashed", startedAt: $t, finishedAt: $t}}}]}}')" >/dev/null
	echo "$pod"
}
# rank_uid NAME RANK: the UID of the rank's live pod.
rank_uid() {
	kubectl get pods -n "$ns" -l "training.zaya.dev/job-name=$1,training.zaya.dev/rank=$2" -o json |
		jq -r '[.items[] | select(.metadata.deletionTimestamp == null)][0].metadata.uid'
}
# renewed NAME RANK UID: the rank has a live pod other than UID: a restart (or, in place, a
# replacement) gave it a new one.
renewed() {
	local now
	now=$(rank_uid "$1" "$2")
	[ -n "$now" ] && [ "$now" != null ] && [ "$now" != "$3" ]
}
delete_rank() {
	local pod
	pod=$(kubectl get pods -n "$ns" -l "training.zaya.dev/job-name=$1,training.zaya.dev/rank=$2" -o json |
		jq -r '[.items[] | select(.metadata.deletionTimestamp == null)][0].metadata.name')
	kubectl delete pod -n "$ns" "$pod" --wait=false >&2
	echo "$pod"
}
pass() { echo "PASS: $*"; passed+=("$1"); }
show() {
	kubectl get ztj -n "$ns" -o custom-columns='JOB:.metadata.name,RESTARTS:.status.restarts,READY:.status.readyNodes,QUEUED:.status.conditions[?(@.type=="Queued")].reason' 2>/dev/null || true
	kubectl get workloads -n "$ns" 2>/dev/null || true
	kubectl get pods -n "$ns" -o wide 2>/dev/null | head -20 || true
	kubectl get events -n "$ns" --sort-by=.lastTimestamp 2>/dev/null | grep -i zayatrainingjob | tail -15 || true
}

# allow_preemption: WorkloadPriorityClass high, and ClusterQueue mi300x preempting lower
# priorities for it.
allow_preemption() {
	kubectl apply -f - >/dev/null <<YAML
apiVersion: kueue.x-k8s.io/v1beta2
kind: WorkloadPriorityClass
metadata: {name: high}
value: 1000
YAML
	kubectl patch clusterqueue mi300x --type=merge -p '{"spec":{"preemption":{"withinClusterQueue":"LowerPriority"}}}' >/dev/null
}

# queue NAME FLAVOR [ADMISSION_CHECK]: ClusterQueue NAME with two nodes' worth of FLAVOR (16
# GPUs; every resource a worker pod requests covered) and LocalQueue NAME on it.
queue() {
	local checks=""
	[ -n "${3:-}" ] && checks="admissionChecksStrategy: {admissionChecks: [{name: $3}]}"
	kubectl apply -f - >/dev/null <<YAML
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: $1}
spec:
  namespaceSelector: {}
  $checks
  resourceGroups:
  - coveredResources: [cpu, memory, amd.com/gpu, amd.com/nic]
    flavors:
    - name: $2
      resources:
      - {name: cpu, nominalQuota: "400"}
      - {name: memory, nominalQuota: 3400Gi}
      - {name: amd.com/gpu, nominalQuota: "16"}
      - {name: amd.com/nic, nominalQuota: "16"}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: $1, namespace: $ns}
spec: {clusterQueue: $1}
YAML
	kubectl wait --for=condition=Active --timeout=60s "clusterqueue/$1" >/dev/null
}

# tas_queue: the fake nodes in rail blocks of two (label zaya.dev/rail-block), a Topology of
# rail blocks and hosts, and LocalQueue tas whose flavor uses it.
tas_queue() {
	local nodes i=0 node
	nodes=$(kubectl get nodes -l type=kwok -o jsonpath='{.items[*].metadata.name}')
	for node in $nodes; do
		kubectl label node "$node" --overwrite "zaya.dev/rail-block=block-$((i / 2))" >/dev/null
		i=$((i + 1))
	done
	kubectl apply -f - >/dev/null <<YAML
apiVersion: kueue.x-k8s.io/v1beta2
kind: Topology
metadata: {name: rails}
spec:
  levels:
  - nodeLabel: zaya.dev/rail-block
  - nodeLabel: kubernetes.io/hostname
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: mi300x-tas}
spec:
  nodeLabels: {amd.com/gpu.product-name: AMD_Instinct_MI300X_OAM}
  topologyName: rails
YAML
	queue tas mi300x-tas
}

# same_block JOB: the job's live pods are all in one rail block.
same_block() {
	local blocks
	blocks=$(kubectl get pods -n "$ns" -l "training.zaya.dev/job-name=$1" -o json |
		jq -r '.items[] | select(.metadata.deletionTimestamp == null and .status.phase != "Failed" and .status.phase != "Succeeded") | .spec.nodeName' |
		xargs -r -n1 kubectl get node -o jsonpath='{.metadata.labels.zaya\.dev/rail-block}{"\n"}' | sort -u)
	[ "$(wc -l <<<"$blocks")" = 1 ] && [ -n "$blocks" ]
}

# ---------------------------------------------------------------------------------------------
workload_scenarios() {
	step "workload path: operator with --kueue-workloads"
	start_operator "$work/operator-workload.log" --kueue-workloads --progress-poll-interval=0
	local a_wl a_uid b_wl before

	# 1. Short quota: 16 GPUs, two jobs of 2 nodes: one runs, one waits with no pod.
	ztj a 2 workload
	wait_for 60 "job a running under its admitted Workload" running a 2
	a_wl=$(wl a)
	a_uid=$(wl_uid "$a_wl")
	wait_for 30 "Workload $a_wl PodsReady" eval '[ "$(wl_condition "$a_wl" PodsReady)" = True ]'
	ztj b 2 workload
	wait_for 30 "job b's Workload" has_wl b
	b_wl=$(wl b)
	wait_for 30 "job b Queued" condition b Queued WaitingForKueue
	sleep 3
	no_pods b || die "job b has pods while its Workload waits for quota"
	wl_queued "$b_wl" || die "Workload $b_wl holds quota beyond the ClusterQueue's"
	pass "short-quota" "a admitted and running (Workload $a_wl, PodsReady), b queued with no pod"

	# 2. Gang restart (a rank deleted, restartMode Recreate): inside the admission.
	before=$(attempt a)
	local t0 uid
	t0=$(date +%s%N)
	uid=$(rank_uid a 1)
	echo "deleted $(delete_rank a 1)"
	wait_for 60 "job a's rank 1 renewed" renewed a 1 "$uid"
	wait_for 60 "job a running again" running a 2
	echo "measured: workload path, rank deleted -> gang running again: $((($(date +%s%N) - t0) / 1000000)) ms"
	[ "$(wl a)" = "$a_wl" ] && [ "$(wl_uid "$a_wl")" = "$a_uid" ] || die "job a's Workload changed across a gang restart"
	wl_admitted "$a_wl" || die "Workload $a_wl lost its admission in a gang restart"
	[ "$(wl_condition "$a_wl" Evicted)" != True ] || die "Workload $a_wl was evicted by a gang restart"
	no_pods b || die "job b got pods during a's restart"
	wait_for 30 "Workload $a_wl PodsReady again" eval '[ "$(wl_condition "$a_wl" PodsReady)" = True ]'
	pass "gang-restart" "rank 1 renewed (attempt $before -> $(attempt a)), same Workload, still admitted, b still queued"

	# 3. Worker crash: the same, from a failed rank.
	before=$(attempt a)
	echo "crashed $(crash a 0)"
	wait_for 60 "job a's next attempt" attempt_above a "$before"
	wait_for 60 "job a running again" running a 2
	wl_admitted "$a_wl" && [ "$(wl_uid "$a_wl")" = "$a_uid" ] || die "a worker crash cost job a its admission"
	no_pods b || die "job b got pods during a's crash recovery"
	pass "worker-crash" "exit 1 on rank 0: attempt $before -> $(attempt a), inside the admission"

	# 4. Suspend/resume: a's quota goes to b; resumed, a queues again.
	kubectl patch ztj -n "$ns" a --type=merge -p '{"spec":{"suspend":true}}' >/dev/null
	wait_for 60 "job a's pods stopped" no_live_pods a
	wait_for 30 "job a's Workload gone" eval '! has_wl a'
	wait_for 60 "job b admitted and running" running b 2
	kubectl patch ztj -n "$ns" a --type=merge -p '{"spec":{"suspend":false}}' >/dev/null
	wait_for 30 "job a's new Workload" has_wl a
	wait_for 30 "job a Queued" condition a Queued WaitingForKueue
	sleep 3
	no_live_pods a || die "resumed job a runs past the quota"
	pass "suspend-resume" "suspended a held no quota (b ran); resumed a queued"

	# 5. Preemption: c (priority high) takes b's quota; b stops, hands the quota back, queues.
	allow_preemption
	local b_restarts_before
	b_restarts_before=$(kubectl get ztj -n "$ns" b -o jsonpath='{.status.restartTimes}' | jq 'length')
	ztj c 2 workload high
	wait_for 90 "job b preempted (Queued KueuePreempted)" condition b Queued KueuePreempted
	wait_for 60 "job b's pods gone" no_live_pods b
	wait_for 60 "job c running" running c 2
	b_wl=$(wl b)
	wait_for 30 "Workload $b_wl's quota handed back" wl_queued "$b_wl"
	[ "$(kubectl get ztj -n "$ns" b -o jsonpath='{.status.restartTimes}' | jq 'length')" = "$b_restarts_before" ] ||
		die "the preemption counted against b's restart budget"
	pass "preemption" "c (high) preempted b: b stopped, admission cleared, queued again, no budget spent"

	# 6. Delete: c's Workload lets go, its quota goes to a queued job.
	local c_wl
	c_wl=$(wl c)
	kubectl delete ztj -n "$ns" c --wait=false >/dev/null
	wait_for 60 "job c's pods gone" no_pods c
	wait_for 60 "Workload $c_wl gone or finished" gone_or_finished "$c_wl"
	wait_for 90 "a queued job admitted after c's delete" eval 'running a 2 || running b 2'
	pass "delete" "c deleted: Workload $c_wl released, a queued job runs"

	# 7. Kueue down: its pod webhook fails closed, so a restart's pods wait (FailedCreate) and a
	# new job cannot be queued (its Workload is refused); both go on once Kueue is back, the
	# restart still inside its admission.
	local up=a
	running a 2 || up=b
	local up_wl
	up_wl=$(wl "$up")
	stop_kueue
	uid=$(rank_uid "$up" 0)
	echo "deleted $(delete_rank "$up" 0)"
	wait_for 60 "FailedCreate for job $up" eval 'kubectl get events -n "$ns" --field-selector "involvedObject.name=$up,reason=FailedCreate" -o name | grep -q .'
	ztj d 1 workload
	wait_for 60 "job d saying it cannot be queued" queued_says d "cannot queue"
	start_kueue workload
	wait_for 90 "job $up's rank 0 renewed" renewed "$up" 0 "$uid"
	wait_for 90 "job $up running again" running "$up" 2
	wl_admitted "$up_wl" || die "job $up lost its admission while Kueue was down"
	wait_for 60 "job d's Workload" has_wl d
	pass "kueue-down" "pods of $up's restart refused until Kueue was back (FailedCreate), then ran inside the same admission; d queued once Kueue answered"
	kubectl delete ztj -n "$ns" d --wait=false >/dev/null

	# 8. Topology: nodes in two rail blocks; a ring of 16 GPUs (2 nodes) kept in one block, its
	# ranks placed by Kueue's ungater, and a restart placed again inside the admission.
	kubectl delete ztj -n "$ns" a b --wait=false >/dev/null
	wait_for 60 "jobs a and b gone" eval 'no_pods a && no_pods b'
	tas_queue
	kubectl apply -f - >/dev/null <<YAML
apiVersion: training.zaya.dev/v1alpha1
kind: ZayaTrainingJob
metadata:
  name: ring
  namespace: $ns
  labels: {kueue.x-k8s.io/queue-name: tas}
  annotations: {kueue.x-k8s.io/podset-preferred-topology: zaya.dev/rail-block, kueue.x-k8s.io/podset-slice-required-topology: zaya.dev/rail-block}
spec:
  nodes: 2
  parallelism: {contextParallel: 16}
  faultTolerance: {maxRestarts: 50, restartMode: Recreate, terminatingTimeout: 10s}
  template:
    spec:
      terminationGracePeriodSeconds: 1
      containers: [{name: worker, image: zaya-worker:kueue-e2e}]
YAML
	wait_for 90 "ring job running" running ring 2
	local hostsel
	hostsel=$(kubectl get pods -n "$ns" -l training.zaya.dev/job-name=ring -o jsonpath='{range .items[*]}{.metadata.labels.training\.zaya\.dev/rank}={.spec.nodeSelector.kubernetes\.io/hostname} {end}')
	[ -n "${hostsel//[ =0-9]/}" ] || die "Kueue's ungater placed no ring rank (node selectors: $hostsel)"
	same_block ring || die "the ring's ranks are in different rail blocks"
	local r_wl
	r_wl=$(wl ring)
	uid=$(rank_uid ring 0)
	echo "deleted $(delete_rank ring 0)"
	wait_for 60 "ring's rank 0 renewed" renewed ring 0 "$uid"
	wait_for 90 "ring running again, placed by Kueue" running ring 2
	same_block ring || die "the restarted ring's ranks are in different rail blocks"
	wl_admitted "$r_wl" || die "the ring's restart cost its admission"
	pass "topology" "ring in one rail block (ranks by index: $hostsel), restart re-placed inside the admission"
	kubectl delete ztj -n "$ns" ring --wait=false >/dev/null
	wait_for 60 "ring gone" no_pods ring
	stop_operator
}

# ---------------------------------------------------------------------------------------------
podgroup_scenarios() {
	step "pod-group path: operator without --kueue-workloads"
	start_operator "$work/operator-podgroup.log" --progress-poll-interval=0
	local before

	# 1. Short quota.
	ztj a 2 podgroup
	wait_for 60 "job a running" running a 2
	ztj b 2 podgroup
	wait_for 30 "job b Queued behind Kueue's gate" condition b Queued WaitingForKueue
	sleep 3
	! running b 2 || die "job b runs past the quota"
	pass "short-quota" "a admitted as a group and running, b's ranks gated"

	# 2. Gang restart: a new group; the old one's pods do not stick on Kueue's finalizer.
	before=$(attempt a)
	local t0
	t0=$(date +%s%N)
	echo "deleted $(delete_rank a 1)"
	wait_for 60 "job a's next attempt" attempt_above a "$before"
	wait_for 60 "no pod stuck on Kueue's finalizer" no_stuck_pods
	wait_for 90 "a gang running (a's new group or b)" eval 'running a 2 || running b 2'
	echo "measured: pod-group path, rank deleted -> a gang running again: $((($(date +%s%N) - t0) / 1000000)) ms"
	pass "gang-restart" "attempt $before -> $(attempt a): old group let go, no stuck pod, a gang runs"

	# 3. Worker crash.
	local victim=a
	running a 2 || victim=b
	before=$(attempt "$victim")
	echo "crashed $(crash "$victim" 0)"
	wait_for 60 "job $victim's next attempt" attempt_above "$victim" "$before"
	wait_for 60 "no pod stuck on Kueue's finalizer" no_stuck_pods
	wait_for 90 "a gang running" eval 'running a 2 || running b 2'
	pass "worker-crash" "exit 1 in $victim: attempt $before -> $(attempt "$victim"), no stuck pod, a gang runs"

	# 4. Suspend/resume: the suspended job's group frees the quota.
	local run=a other=b
	running a 2 || { run=b other=a; }
	kubectl patch ztj -n "$ns" "$run" --type=merge -p '{"spec":{"suspend":true}}' >/dev/null
	wait_for 60 "job $run's pods stopped" no_live_pods "$run"
	wait_for 90 "job $other running on the freed quota" running "$other" 2
	kubectl patch ztj -n "$ns" "$run" --type=merge -p '{"spec":{"suspend":false}}' >/dev/null
	wait_for 30 "resumed job $run Queued" condition "$run" Queued WaitingForKueue
	pass "suspend-resume" "suspended $run freed its group's quota ($other ran); resumed $run queued"

	# 5. Preemption: c's pods (priority high) preempt the running group.
	allow_preemption
	local budget
	budget=$(kubectl get ztj -n "$ns" "$other" -o jsonpath='{.status.restartTimes}' | jq 'length')
	before=$(attempt "$other")
	ztj c 2 podgroup high
	wait_for 90 "job c running" running c 2
	wait_for 60 "job $other's next attempt" attempt_above "$other" "$before"
	wait_for 60 "no pod stuck on Kueue's finalizer" no_stuck_pods
	[ "$(kubectl get ztj -n "$ns" "$other" -o jsonpath='{.status.lastFailure.reason}')" = Preempted ] ||
		die "job $other's preemption is recorded as $(kubectl get ztj -n "$ns" "$other" -o jsonpath='{.status.lastFailure.reason}')"
	[ "$(kubectl get ztj -n "$ns" "$other" -o jsonpath='{.status.restartTimes}' | jq 'length')" = "$budget" ] ||
		die "the preemption counted against $other's restart budget"
	pass "preemption" "c (high) preempted $other: recorded as Preempted, no budget spent, no stuck pod"

	# 6. Delete: no pod of the deleted job waits on Kueue's finalizer; its quota goes on.
	kubectl delete ztj -n "$ns" c --wait=false >/dev/null
	wait_for 60 "job c's pods gone" no_pods c
	wait_for 90 "a queued job running after c's delete" eval 'running a 2 || running b 2'
	kubectl delete ztj -n "$ns" a b --wait=false >/dev/null
	wait_for 60 "jobs a and b gone, no pod left" eval 'no_pods a && no_pods b'
	wait_for 60 "empty ClusterQueue mi300x" cq_empty
	pass "delete" "deleted jobs leave no pod and no admitted workload"
	kubectl patch clusterqueue mi300x --type=json -p '[{"op":"remove","path":"/spec/preemption"}]' >/dev/null 2>&1 || true

	# 7. Topology: the group's ranks, indexed by rank, kept in one rail block; a restart's new
	# group placed again.
	tas_queue
	kubectl apply -f - >/dev/null <<YAML
apiVersion: training.zaya.dev/v1alpha1
kind: ZayaTrainingJob
metadata: {name: ring, namespace: $ns}
spec:
  nodes: 2
  parallelism: {contextParallel: 16}
  faultTolerance: {maxRestarts: 50, restartMode: Recreate, terminatingTimeout: 10s}
  template:
    metadata:
      labels: {kueue.x-k8s.io/queue-name: tas}
      annotations: {kueue.x-k8s.io/podset-required-topology: zaya.dev/rail-block}
    spec:
      terminationGracePeriodSeconds: 1
      containers: [{name: worker, image: zaya-worker:kueue-e2e}]
YAML
	wait_for 90 "ring job running" running ring 2
	local index
	index=$(kubectl get pods -n "$ns" -l training.zaya.dev/job-name=ring -o jsonpath='{range .items[*]}{.metadata.labels.training\.zaya\.dev/rank}={.metadata.labels.kueue\.x-k8s\.io/pod-group-pod-index} {end}')
	[ "$index" = "0=0 1=1 " ] || die "Kueue's pod index is not the rank: $index"
	same_block ring || die "the ring's ranks are in different rail blocks"
	before=$(attempt ring)
	echo "deleted $(delete_rank ring 0)"
	wait_for 60 "ring's next attempt" attempt_above ring "$before"
	wait_for 90 "ring running again" running ring 2
	same_block ring || die "the restarted ring's ranks are in different rail blocks"
	wait_for 60 "no pod stuck on Kueue's finalizer" no_stuck_pods
	pass "topology" "a group in one rail block, pod index = rank ($index), its restart's group placed again"
	kubectl delete ztj -n "$ns" ring --wait=false >/dev/null
	wait_for 60 "ring gone" no_pods ring
	stop_operator
}
