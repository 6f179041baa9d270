package v1alpha1

import "github.com/zaya-operator/zaya-operator/api/contract"

// The worker contract (docs/worker-contract.md): what the operator gives every worker
// container and what it expects back. The values live in api/contract, which the worker
// imports without linking Kubernetes; these names keep the operator's code unchanged.
const (
	// MasterPort is the rendezvous port on rank 0 (MASTER_PORT), exposed by the job's Service.
	MasterPort = contract.MasterPort
	// HeartbeatFile is where workers touch a file every step (ZAYA_HEARTBEAT_FILE).
	HeartbeatFile = contract.HeartbeatFile
	// TerminationMessageCheckpointPrefix starts the termination-message line that reports
	// the last committed checkpoint step: "checkpoint-step=1200".
	TerminationMessageCheckpointPrefix = contract.TerminationMessageCheckpointPrefix
	// TerminationMessageHangPrefix starts the line the heartbeat liveness probe appends to the
	// termination log before the kubelet kills a hung worker.
	TerminationMessageHangPrefix = contract.TerminationMessageHangPrefix
	// TerminationMessageRestoredPrefix starts the line with the step the workers resumed from.
	TerminationMessageRestoredPrefix = contract.TerminationMessageRestoredPrefix
	// TerminationMessageCorruptPrefix starts a line naming a step moved aside as corrupt.
	TerminationMessageCorruptPrefix = contract.TerminationMessageCorruptPrefix
	// TerminationMessageStoppedPrefix starts the line of a worker stopped before completion.
	TerminationMessageStoppedPrefix = contract.TerminationMessageStoppedPrefix
	// ExitStopped is the exit code of a worker stopped before completion (retryable).
	ExitStopped = contract.ExitStopped
	// ExitNoResize is the exit code of an elastic job's worker that refuses a shrunk width.
	ExitNoResize = contract.ExitNoResize
	// InPlaceAttemptBits splits the reference worker's checkpoint attempt numbers into the
	// generation (ZAYA_RESTART_ATTEMPT) and the starts within it.
	InPlaceAttemptBits = contract.InPlaceAttemptBits
	// TerminationMessageTrainingStepPrefix starts the line with the step a worker reached.
	TerminationMessageTrainingStepPrefix = contract.TerminationMessageTrainingStepPrefix
	// TerminationMessageStepSecondsPrefix starts the line with a worker's mean step time.
	TerminationMessageStepSecondsPrefix = contract.TerminationMessageStepSecondsPrefix
	// TerminationMessageTrainingSincePrefix starts the line with when a worker's run began training.
	TerminationMessageTrainingSincePrefix = contract.TerminationMessageTrainingSincePrefix
	// TerminationMessageLastStepAtPrefix starts the line with when a worker's run last finished a step.
	TerminationMessageLastStepAtPrefix = contract.TerminationMessageLastStepAtPrefix
	// RestartExitCodesAnnotation carries a supervised pod's restart rule.
	RestartExitCodesAnnotation = contract.RestartExitCodesAnnotation
	// TerminationMessageExitCodePrefix starts zaya-supervisor's line for a worker exit that
	// does not restart in place.
	TerminationMessageExitCodePrefix = contract.TerminationMessageExitCodePrefix
)

// Environment variables of the worker contract.
const (
	EnvMasterAddr        = contract.EnvMasterAddr
	EnvMasterPort        = contract.EnvMasterPort
	EnvWorldSize         = contract.EnvWorldSize
	EnvNNodes            = contract.EnvNNodes
	EnvNodeRank          = contract.EnvNodeRank
	EnvGPUsPerNode       = contract.EnvGPUsPerNode
	EnvLocalWorldSize    = contract.EnvLocalWorldSize
	EnvRank              = contract.EnvRank
	EnvLocalRank         = contract.EnvLocalRank
	EnvGroupRank         = contract.EnvGroupRank
	EnvJobName           = contract.EnvJobName
	EnvJobUID            = contract.EnvJobUID
	EnvRestartAttempt    = contract.EnvRestartAttempt
	EnvContextParallel   = contract.EnvContextParallel
	EnvTargetNodes       = contract.EnvTargetNodes
	EnvCheckpointDir     = contract.EnvCheckpointDir
	EnvCheckpointEvery   = contract.EnvCheckpointEvery
	EnvCheckpointKeep    = contract.EnvCheckpointKeep
	EnvHeartbeatFile     = contract.EnvHeartbeatFile
	EnvCollectiveTimeout = contract.EnvCollectiveTimeout
	// EnvRestartExitCodes is the restart rule zaya-supervisor applies.
	EnvRestartExitCodes = contract.EnvRestartExitCodes
	// EnvTerminationLog is the container's terminationMessagePath, where the worker appends
	// the checkpoint-step line (and the heartbeat probe the hang line).
	EnvTerminationLog = contract.EnvTerminationLog
)
