package v1alpha1

// ControllerName is the value of spec.managedBy (or its absence) that this operator reconciles.
const ControllerName = "training.zaya.dev/zaya-operator"

// Labels and annotations the operator puts on the objects it creates.
const (
	// JobNameLabel names the ZayaTrainingJob that owns a pod, service or claim.
	JobNameLabel = "training.zaya.dev/job-name"
	// RankLabel is a worker pod's NODE_RANK.
	RankLabel = "training.zaya.dev/rank"
	// AttemptLabel is the restart attempt (status.restarts) a pod belongs to.
	AttemptLabel = "training.zaya.dev/attempt"
	// RoleLabel is "rank" on a worker pod: the rendezvous Service selects it, so warm spares
	// (which carry the job's name label) are never published as peers.
	RoleLabel = "training.zaya.dev/role"
	// RoleRank is RoleLabel's value on a rank's pod.
	RoleRank = "rank"
	// SpareLabel marks a warm spare pod (faultTolerance.spares) with its index.
	SpareLabel = "training.zaya.dev/spare"
	// PodMarkAnnotation carries the operator's HMAC of a worker pod's identity (job UID,
	// attempt, rank, name): a pod without a valid one is not the job's, whatever it claims.
	PodMarkAnnotation = "training.zaya.dev/pod-mark"
	// MaxStatusCount is the schema's bound on status.restarts and status.inPlaceRestarts: the
	// operator's counters saturate there, and a job whose restarts reach it fails.
	MaxStatusCount = 1_000_000_000
	// QuarantineTaintKey is the taint put on a node a job quarantined for a platform signal
	// (lost node, unhealthy device) when quarantine.nodeTaint is NoSchedule; removed when
	// QuarantineTaintUntilAnnotation passes.
	QuarantineTaintKey = "training.zaya.dev/quarantined"
	// QuarantineTaintUntilAnnotation is when the quarantine taint expires (RFC 3339).
	QuarantineTaintUntilAnnotation = "training.zaya.dev/quarantined-until"
	// HardwareSuspectTaintKey is the cluster-wide taint (NoSchedule, value the category) on a
	// node that rooted hardware failures in jobs of several namespaces (operator flag
	// --hardware-taint-namespaces); removed when HardwareSuspectUntilAnnotation passes.
	HardwareSuspectTaintKey = "training.zaya.dev/hardware-suspect"
	// HardwareSuspectUntilAnnotation is when the hardware-suspect taint expires (RFC 3339).
	HardwareSuspectUntilAnnotation = "training.zaya.dev/hardware-suspect-until"
	// HardwareRootsAnnotation keeps, on a node, the namespaces whose jobs rooted hardware
	// failures there and when: "<namespace>=<RFC 3339>,…".
	HardwareRootsAnnotation = "training.zaya.dev/hardware-roots"
)

// Condition types of status.conditions.
const (
	// ConditionCreated is True once the operator has accepted the job and created its objects.
	ConditionCreated = "Created"
	// ConditionRunning is True while every rank of the current attempt is running.
	ConditionRunning = "Running"
	// ConditionRestarting is True between a failure and the new gang running.
	ConditionRestarting = "Restarting"
	// ConditionStraggling is True while a rank's steps keep it busy longer than the others'
	// by faultTolerance.stragglers.marginPercent (rank 0's progress reports).
	ConditionStraggling = "Straggling"
	// ConditionWaitingForCapacity is True while the gang cannot be fully placed.
	ConditionWaitingForCapacity = "WaitingForCapacity"
	// ConditionShrunk is True while an elastic job trains on fewer nodes than spec.nodes.
	ConditionShrunk = "Shrunk"
	// ConditionQueued is True while Kueue's admission gate holds ranks of the current attempt
	// (Kueue's pod integration): the gang waits for quota, not for nodes.
	ConditionQueued = "Queued"
	// ConditionSuspended is True while spec.suspend is true and no pods run.
	ConditionSuspended = "Suspended"
	// ConditionSucceeded is True when the job finished successfully. Terminal.
	ConditionSucceeded = "Succeeded"
	// ConditionFailed is True when the job failed for good. Terminal.
	ConditionFailed = "Failed"
)

// Condition reasons.
const (
	// ReasonAccepted: the spec is valid and the operator owns the job.
	ReasonAccepted = "Accepted"
	// ReasonInvalidSpec: the spec breaks a rule the CRD schema cannot express.
	ReasonInvalidSpec = "InvalidSpec"
	// ReasonAcceptedBeforeUpgrade: an earlier operator accepted this generation of the spec and
	// this one's stricter rules refuse it; it keeps running, and the next edit must pass them.
	ReasonAcceptedBeforeUpgrade = "AcceptedBeforeUpgrade"
	// ReasonStatusTooLarge: the job's status cannot be stored, the object being too large.
	ReasonStatusTooLarge = "StatusTooLarge"
	// ReasonCheckpointRestored: the event naming the checkpoint step an attempt resumed from.
	ReasonCheckpointRestored = "CheckpointRestored"
	// ReasonCheckpointCorrupt: an attempt found committed steps corrupt, moved them aside and
	// resumed from an older one.
	ReasonCheckpointCorrupt = "CheckpointCorrupt"
	// ReasonSupervisorNotInjected: faultTolerance.supervisor is Inject but the worker's
	// command could not be wrapped (the template sets none).
	ReasonSupervisorNotInjected = "SupervisorNotInjected"
	// ReasonInvalidPodTemplate: the apiserver refused the worker pod built from the template.
	ReasonInvalidPodTemplate = "InvalidPodTemplate"
	// ReasonNetworkConfigured: the event listing the effective RCCL environment.
	ReasonNetworkConfigured = "NetworkConfigured"
	// ReasonCheckpointClaimCreated: the operator created the checkpoint claim.
	ReasonCheckpointClaimCreated = "CheckpointClaimCreated"
	// ReasonCheckpointClaimShared: the job mounts another job's claim and became its co-owner,
	// so deleting that job keeps the claim.
	ReasonCheckpointClaimShared = "CheckpointClaimShared"
	// ReasonCheckpointClaimAccessMode: the existing checkpoint claim is ReadWriteOnce and the
	// job's ranks mount it from several nodes, which block storage cannot serve.
	ReasonCheckpointClaimAccessMode = "CheckpointClaimAccessMode"
	// ReasonPodRelabelled: a rank's pod had lost the labels the operator finds it by; they were
	// put back, so it is neither taken for gone nor left running beside its replacement.
	ReasonPodRelabelled = "PodRelabelled"
	// ReasonPodsCreated: the operator created worker pods.
	ReasonPodsCreated = "PodsCreated"
	// ReasonFailedCreate: the API server refused a worker pod for a reason other than its
	// validity (Pod Security admission, a ResourceQuota, a webhook); retried with backoff.
	ReasonFailedCreate = "FailedCreate"
	// ReasonStarting: some ranks are not running yet.
	ReasonStarting = "Starting"
	// ReasonRankNotStarting: a placed rank's worker container has waited too long to start (an
	// image that cannot be pulled, a missing Secret or ConfigMap, a volume that does not attach
	// or mount); the message names the rank, its node and the kubelet's reason.
	ReasonRankNotStarting = "RankNotStarting"
	// ReasonAllRanksRunning: every rank of the current attempt runs.
	ReasonAllRanksRunning = "AllRanksRunning"
	// ReasonUnschedulable: the scheduler cannot place some ranks.
	ReasonUnschedulable = "Unschedulable"
	// ReasonPlaced: every rank has been placed (or no placement is pending).
	ReasonPlaced = "Placed"
	// ReasonSuspended: spec.suspend is true.
	ReasonSuspended = "Suspended"
	// ReasonWaitingForKueue: ranks carry Kueue's admission scheduling gate (Queued=True).
	ReasonWaitingForKueue = "WaitingForKueue"
	// ReasonAdmitted: Kueue lifted its admission gate from every rank (Queued=False).
	ReasonAdmitted = "Admitted"
	// ReasonResumed: spec.suspend went back to false.
	ReasonResumed = "Resumed"
	// ReasonCompleted: the success policy was met.
	ReasonCompleted = "Completed"
	// ReasonFatalFailure: a rank failed in a way a restart cannot fix (a fatal exit code).
	ReasonFatalFailure = "FatalFailure"
	// ReasonRestartBudgetExceeded: maxRestarts restarts happened within restartWindow.
	ReasonRestartBudgetExceeded = "RestartBudgetExceeded"
	// ReasonUserCodeError: the program failed on its own error (failure category UserCode)
	// more often than faultTolerance.userCodeRestarts allows: restarting will not fix it.
	ReasonUserCodeError = "UserCodeError"
	// ReasonInvalidFailurePatterns: the failure-patterns ConfigMap was refused (an event on it).
	ReasonInvalidFailurePatterns = "InvalidFailurePatterns"
	// ReasonFailurePatternsLoaded: the failure-patterns ConfigMap is in use (an event on it).
	ReasonFailurePatternsLoaded = "FailurePatternsLoaded"
	// ReasonRestarting: the gang is being restarted from the last checkpoint.
	ReasonRestarting = "Restarting"
	// ReasonUnrecognized: a condition's reason taken from a value others wrote
	// (status.lastFailure.reason) that a condition's reason cannot hold.
	ReasonUnrecognized = "Unrecognized"
	// ReasonInPlaceTimedOut: an in-place restart did not bring every rank back within
	// faultTolerance.inPlaceTimeout, so the gang is recreated.
	ReasonInPlaceTimedOut = "InPlaceTimedOut"
	// ReasonInPlaceFailed: a pod failed during an in-place restart, so the gang is recreated.
	ReasonInPlaceFailed = "InPlaceFailed"
	// ReasonInPlaceUnsupported: the cluster dropped or ignored the worker container's restart
	// rules; the gang restarts by recreating its pods.
	ReasonInPlaceUnsupported = "InPlaceUnsupported"
	// ReasonReplacingPods: an in-place restart replaces the pods of ranks that cannot restart
	// in place (their node failed, or they did not rejoin in time).
	ReasonReplacingPods = "ReplacingPods"
	// ReasonSparesCreated: the operator created warm spare pods.
	ReasonSparesCreated = "SparesCreated"
	// ReasonSpareUnavailable: a warm spare pod could not be created (quota, admission).
	ReasonSpareUnavailable = "SpareUnavailable"
	// ReasonShrinking: an elastic job's gang restarts on fewer nodes, a rank having waited
	// elastic.shrinkAfter for a node.
	ReasonShrinking = "Shrinking"
	// ReasonCannotShrink: a rank waits for a node, but the nodes left are fewer than
	// elastic.minNodes (or keep no ring whole): the job waits for capacity.
	ReasonCannotShrink = "CannotShrink"
	// ReasonCapacityBack: the nodes a shrunk gang misses stood ready for elastic.growAfter;
	// it grows at its next checkpoint.
	ReasonCapacityBack = "CapacityBack"
	// ReasonElasticRefused: a worker of the shrunk gang exited ExitNoResize: the job is given
	// its full width back and not shrunk again.
	ReasonElasticRefused = "ElasticRefused"
	// ReasonGrowing: a shrunk gang restarts on more nodes, from the checkpoint just committed.
	ReasonGrowing = "Growing"
	// ReasonRecovered: the restarted gang runs again.
	ReasonRecovered = "Recovered"
	// ReasonHardwareSuspect: a node was tainted (or untainted) cluster-wide for hardware
	// failures rooted there in several namespaces' jobs.
	ReasonHardwareSuspect = "HardwareSuspect"
	// ReasonStragglerDetected: a rank is a straggler (Straggling=True, and its event).
	ReasonStragglerDetected = "StragglerDetected"
	// ReasonNoStraggler: no rank is a straggler now.
	ReasonNoStraggler = "NoStraggler"
	// ReasonForceDeleted: a pod stuck terminating was force-deleted.
	ReasonForceDeleted = "ForceDeleted"
	// ReasonBlockedByFinalizer: a pod of an old attempt is kept by finalizers the operator does
	// not own; the next attempt waits for it.
	ReasonBlockedByFinalizer = "BlockedByFinalizer"
	// ReasonNameConflict: an object the operator would create (the Service, the checkpoint
	// claim, a worker pod) already exists and is not this job's.
	ReasonNameConflict = "NameConflict"
	// ReasonNodeQuarantined: a node was added to the job's quarantine (and maybe tainted).
	ReasonNodeQuarantined = "NodeQuarantined"
	// ReasonNodeReleased: a quarantined node's time ran out.
	ReasonNodeReleased = "NodeReleased"
	// ReasonDeadlineExceeded: activeDeadlineSeconds passed.
	ReasonDeadlineExceeded = "DeadlineExceeded"
	// ReasonFinished: the job succeeded or failed, so it no longer runs.
	ReasonFinished = "Finished"
)

// Failure reasons of status.lastFailure (a failed pod's own status.reason, such as Evicted,
// is used as it is).
const (
	// FailureReasonExitCode: a worker container exited with a retryable non-zero code.
	FailureReasonExitCode = "ExitCode"
	// FailureReasonFatalExitCode: a worker exited with a code classified as fatal.
	FailureReasonFatalExitCode = "FatalExitCode"
	// FailureReasonEvicted: the cluster evicted a rank (node pressure, drain, eviction API).
	FailureReasonEvicted = "Evicted"
	// FailureReasonPreempted: the scheduler preempted a rank.
	FailureReasonPreempted = "Preempted"
	// FailureReasonPodDeleted: a rank's pod was deleted while the gang ran.
	FailureReasonPodDeleted = "PodDeleted"
	// FailureReasonNodeLost: a rank's node stopped answering or shut down.
	FailureReasonNodeLost = "NodeLost"
	// FailureReasonDeviceUnhealthy: a GPU or NIC of a rank's node went unhealthy.
	FailureReasonDeviceUnhealthy = "DeviceUnhealthy"
	// FailureReasonHang: a worker stopped touching its heartbeat file.
	FailureReasonHang = "Hang"
	// FailureReasonStraggler: faultTolerance.stragglers.action Replace replaced a straggler.
	FailureReasonStraggler = "Straggler"
	// FailureReasonNodeRejected: the node refused to admit a rank after it was scheduled
	// there (the kubelet's OutOf<resource>, e.g. OutOfamd.com/gpu when a GPU went unhealthy
	// in between, or another admission error); the pod's own reason is in the message.
	FailureReasonNodeRejected = "NodeRejected"
	// FailureReasonRepeatedFailures: a quarantine reason, not a failure's: ranks failed on the
	// node three times within restartWindow (a fault the health signals do not show).
	FailureReasonRepeatedFailures = "RepeatedFailures"
)

// Worker exit codes of the worker contract (docs/worker-contract.md).
const (
	// ExitCodeConfigError is a configuration error: fatal by default, a restart cannot fix it.
	ExitCodeConfigError = 78
)
