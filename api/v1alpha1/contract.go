package v1alpha1

// The worker contract (docs/worker-contract.md): what the operator gives every worker
// container and what it expects back.
const (
	// MasterPort is the rendezvous port on rank 0 (MASTER_PORT), exposed by the job's Service.
	MasterPort = 29500
	// HeartbeatFile is where workers touch a file every step (ZAYA_HEARTBEAT_FILE).
	HeartbeatFile = "/dev/shm/zaya-heartbeat"
	// TerminationMessageCheckpointPrefix starts the termination-message line that reports
	// the last committed checkpoint step: "checkpoint-step=1200".
	TerminationMessageCheckpointPrefix = "checkpoint-step="
	// TerminationMessageHangPrefix starts the line the heartbeat liveness probe appends to the
	// termination log before the kubelet kills a hung worker.
	TerminationMessageHangPrefix = "zaya: hang:"
)

// Environment variables of the worker contract.
const (
	EnvMasterAddr        = "MASTER_ADDR"
	EnvMasterPort        = "MASTER_PORT"
	EnvWorldSize         = "WORLD_SIZE"
	EnvNNodes            = "NNODES"
	EnvNodeRank          = "NODE_RANK"
	EnvGPUsPerNode       = "GPUS_PER_NODE"
	EnvLocalWorldSize    = "LOCAL_WORLD_SIZE"
	EnvJobName           = "ZAYA_JOB_NAME"
	EnvRestartAttempt    = "ZAYA_RESTART_ATTEMPT"
	EnvContextParallel   = "ZAYA_CONTEXT_PARALLEL"
	EnvCheckpointDir     = "ZAYA_CHECKPOINT_DIR"
	EnvCheckpointEvery   = "ZAYA_CHECKPOINT_INTERVAL"
	EnvCheckpointKeep    = "ZAYA_CHECKPOINT_KEEP"
	EnvHeartbeatFile     = "ZAYA_HEARTBEAT_FILE"
	EnvCollectiveTimeout = "ZAYA_COLLECTIVE_TIMEOUT"
	// EnvTerminationLog is the container's terminationMessagePath, where the worker appends
	// the checkpoint-step line (and the heartbeat probe the hang line).
	EnvTerminationLog = "ZAYA_TERMINATION_LOG"
)
