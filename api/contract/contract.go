// Package contract is the worker contract (docs/worker-contract.md) shared by the operator
// and the worker: what the operator gives every worker container and what it expects back.
// It imports nothing but the standard library, so the worker binary can use it without
// linking Kubernetes or controller-runtime.
package contract

import (
	"strconv"
	"time"
)

const (
	// MasterPort is the rendezvous port on rank 0 (MASTER_PORT), exposed by the job's Service.
	MasterPort = 29500
	// GangWatchPort is where rank 0's zaya-supervisor takes the other ranks' supervisors
	// (workers/gangwatch), at MASTER_ADDR.
	GangWatchPort = 29510
	// SupervisorPort is where an injected zaya-supervisor answers the operator at its pod's
	// own address (SupervisorPath): the operator asks it only of a rank its peers stopped
	// over, to tell a lost node from a slow status (docs/design/fast-node-loss.md). The worker
	// container declares it as SupervisorPortName, which is how the operator knows to ask.
	SupervisorPort = 29511
	// SupervisorPortName names SupervisorPort among the worker container's ports.
	SupervisorPortName = "zaya-supervisor"
	// SupervisorPath answers any GET with SupervisorAnswer while the supervisor runs.
	SupervisorPath = "/zaya/v1/supervisor"
	// SupervisorAnswer is all the supervisor says there.
	SupervisorAnswer = "zaya-supervisor\n"
	// HeartbeatFile is where workers touch a file every step (ZAYA_HEARTBEAT_FILE).
	HeartbeatFile = "/dev/shm/zaya-heartbeat"
	// TerminationMessageCheckpointPrefix starts the termination-message line that reports
	// the last committed checkpoint step: "checkpoint-step=1200".
	TerminationMessageCheckpointPrefix = "checkpoint-step="
	// TerminationMessageHangPrefix starts the line the heartbeat liveness probe appends to the
	// termination log before the kubelet kills a hung worker.
	TerminationMessageHangPrefix = "zaya: hang:"
	// TerminationMessageRestoredPrefix starts the line a worker appends once it has resumed:
	// the checkpoint step every rank restored, "checkpoint-restored=1200" (0: started fresh).
	TerminationMessageRestoredPrefix = "checkpoint-restored="
	// TerminationMessageCorruptPrefix starts a line for each committed step that failed
	// verification on resume and was moved aside:
	// "zaya: checkpoint-corrupt: step=1300 moved to corrupt-step-1300-<time>: <reason>".
	TerminationMessageCorruptPrefix = "zaya: checkpoint-corrupt:"
	// TerminationMessageStoppedPrefix starts the line of a worker that stopped before the run
	// was complete because it or a peer was told to stop (it exits ExitStopped).
	TerminationMessageStoppedPrefix = "zaya: stopped:"
	// TerminationMessageTrainingStepPrefix starts the line with the step a worker had reached
	// when it stopped ("training-step=1234"): with the checkpoint step, the steps a restart
	// trains again.
	TerminationMessageTrainingStepPrefix = "training-step="
	// TerminationMessageStepSecondsPrefix starts the line with the worker's mean seconds per
	// step over its run ("step-seconds=0.512"): what a step trained again costs.
	TerminationMessageStepSecondsPrefix = "step-seconds="
	// TerminationMessageTrainingSincePrefix starts the line with when the worker's run began
	// training, its resume done (RFC 3339, nanoseconds): the end of the time a failure or a
	// start cost.
	TerminationMessageTrainingSincePrefix = "training-since="
	// TerminationMessageLastStepAtPrefix starts the line with when the worker's run last
	// finished a step (RFC 3339, nanoseconds): the start of the time its failure cost.
	TerminationMessageLastStepAtPrefix = "last-step-at="
	// ProgressPort is where the worker serves ProgressPath (its metrics port): the operator
	// polls rank 0's pod there for the job's live progress.
	ProgressPort = 9400
	// ProgressPath serves a Progress as JSON.
	ProgressPath = "/zaya/v1/progress"
	// ProgressMaxBytes bounds the Progress document the operator reads.
	ProgressMaxBytes = 256 << 10
	// ExitStopped is the exit code (EX_TEMPFAIL) of a worker that stopped before the run was
	// complete because it or a peer was told to: never success, always worth a restart.
	ExitStopped = 75
	// ExitConfig is the exit code (EX_CONFIG) of a worker whose configuration is wrong: a
	// restart cannot help, so the operator treats it as fatal by default.
	ExitConfig = 78
	// ExitNoResize is the exit code of an elastic job's worker that cannot train at the width
	// it was started at (NNODES below ZAYA_TARGET_NODES): the operator gives the job its full
	// width back, waits for capacity as a job without elastic does, and does not shrink it
	// again until it is suspended and resumed.
	ExitNoResize = 79
	// InPlaceAttemptBits splits the reference worker's checkpoint attempt numbers: a start
	// of generation G (ZAYA_RESTART_ATTEMPT, which an in-place restart keeps) writes as
	// G<<InPlaceAttemptBits + k, k counting that generation's starts, so every start fences
	// out the writers of the run before it, in place or not.
	InPlaceAttemptBits = 20
	// MaxStep is the largest step number a worker may report (a step a microsecond for 35
	// years): the operator drops a larger one as unreadable, so no step it adds up can wrap.
	MaxStep = 1 << 50
)

// ParseStep reads a step number a worker wrote: a decimal from 0 to MaxStep.
func ParseStep(s string) (int64, bool) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > MaxStep {
		return 0, false
	}
	return n, true
}

// Progress is what rank 0 reports of the job's current run at ProgressPath.
type Progress struct {
	// Step is the last step the run finished; ResumedFrom the step it started from.
	Step        int64 `json:"step"`
	ResumedFrom int64 `json:"resumedFrom"`
	// CheckpointStep is the newest committed checkpoint.
	CheckpointStep int64 `json:"checkpointStep"`
	// StepSeconds is the run's mean wall time per step.
	StepSeconds float64 `json:"stepSeconds"`
	// TrainingSince is when the run began training (resume done); LastStepAt when it last
	// finished a step. Both zero before the first step.
	TrainingSince time.Time `json:"trainingSince,omitzero"`
	LastStepAt    time.Time `json:"lastStepAt,omitzero"`
	// StartedAt is when the run's worker process started; MetAt when the run had met its
	// peers (under zaya-supervisor: the trainer's first report, written once it met them and
	// resumed). Zero where the worker does not say.
	StartedAt time.Time `json:"startedAt,omitzero"`
	MetAt     time.Time `json:"metAt,omitzero"`
	// NodeStepSeconds holds, by NODE_RANK, the node's moving mean of the seconds a step kept
	// its ranks busy before they met in the step's all-reduce: a straggler's is the largest.
	NodeStepSeconds []float64 `json:"nodeStepSeconds,omitempty"`
}

// Environment variables of the worker contract.
const (
	EnvMasterAddr     = "MASTER_ADDR"
	EnvMasterPort     = "MASTER_PORT"
	EnvWorldSize      = "WORLD_SIZE"
	EnvNNodes         = "NNODES"
	EnvNodeRank       = "NODE_RANK"
	EnvGPUsPerNode    = "GPUS_PER_NODE"
	EnvLocalWorldSize = "LOCAL_WORLD_SIZE"
	// EnvRank, EnvLocalRank and EnvGroupRank have torchrun's meanings for the pod's one
	// process, local rank 0 of its node: RANK = NODE_RANK × GPUS_PER_NODE (the global rank of
	// the node's first GPU), LOCAL_RANK = 0, GROUP_RANK = NODE_RANK. A launcher that starts one
	// process per GPU gives process i RANK+i and LOCAL_RANK i; with one GPU per node the pod's
	// process is the rank, and a plain torch.distributed env:// init finds all it reads.
	EnvRank      = "RANK"
	EnvLocalRank = "LOCAL_RANK"
	EnvGroupRank = "GROUP_RANK"
	EnvJobName   = "ZAYA_JOB_NAME"
	// EnvJobUID is the job's UID: with the attempt, the ranks' rendezvous token; and the owner
	// of the checkpoint directory, so a job recreated on a kept volume takes it over from the
	// deleted one (docs/worker-contract.md).
	EnvJobUID          = "ZAYA_JOB_UID"
	EnvRestartAttempt  = "ZAYA_RESTART_ATTEMPT"
	EnvContextParallel = "ZAYA_CONTEXT_PARALLEL"
	// EnvTargetNodes is the node count an elastic job trains at when whole (spec.nodes), set
	// only for elastic jobs; NNODES is this run's, fewer while the job is shrunk. A trainer
	// keeps its global batch that of EnvTargetNodes nodes at every width
	// (docs/worker-contract.md, "Elastic jobs").
	EnvTargetNodes       = "ZAYA_TARGET_NODES"
	EnvCheckpointDir     = "ZAYA_CHECKPOINT_DIR"
	EnvCheckpointEvery   = "ZAYA_CHECKPOINT_INTERVAL"
	EnvCheckpointKeep    = "ZAYA_CHECKPOINT_KEEP"
	EnvHeartbeatFile     = "ZAYA_HEARTBEAT_FILE"
	EnvCollectiveTimeout = "ZAYA_COLLECTIVE_TIMEOUT"
	// EnvPeerTimeout bounds how long the reference worker lets a peer stay silent before it
	// stops with exit 75 (a Go duration; 0 or negative: no bound). The operator does not set
	// it and a pod template may not set ZAYA_*: on a cluster the worker's -peer-timeout does.
	EnvPeerTimeout = "ZAYA_PEER_TIMEOUT"
	// EnvTerminationLog is the container's terminationMessagePath, where the worker appends
	// the checkpoint-step line (and the heartbeat probe the hang line).
	EnvTerminationLog = "ZAYA_TERMINATION_LOG"
)

// EnvPodIP is the pod's own address (status.podIP), which the operator gives a worker
// container it puts under zaya-supervisor: the supervisor binds its gang-watch hub and its
// progress port to it rather than to every address, so pods that share a network (the test
// node agent's) each bind their own.
const EnvPodIP = "ZAYA_POD_IP"

// EnvNodeLostAt is when the operator decided that the rank this pod replaces was lost with its
// node (RFC 3339, to the microsecond), set on such a replacement only. Its node may only be
// cut off: the old rank's own supervisor then stops its worker once it finds the hub gone,
// at most a quarter of the peer timeout and its cut grace after that decision, so zaya-supervisor
// starts this pod's worker no earlier (docs/design/fast-node-loss.md, "Why it is safe").
const EnvNodeLostAt = "ZAYA_NODE_LOST_AT"

// EnvProgressFile names the file a trainer under zaya-supervisor may overwrite with its
// progress ("step=N" and "checkpoint=N", optionally "resumed=N", a line each): the supervisor
// serves it at ProgressPath and appends it to the termination message for a trainer that
// cannot (docs/worker-contract.md, "Progress"). The supervisor sets it, not the operator.
const EnvProgressFile = "ZAYA_PROGRESS_FILE"
