package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ZayaTrainingJobSpec is the desired state of a distributed training job: one worker pod per
// node, restarted as a whole gang from the last checkpoint when anything fails.
//
// Fields that shape the gang (nodes, gpusPerNode, parallelism, network, placement, template) can change
// only while the job is suspended, so a running gang is never silently out of date.
// +kubebuilder:validation:XValidation:rule="self.parallelism.contextParallel < 1 || self.nodes * self.gpusPerNode % self.parallelism.contextParallel == 0",message="parallelism.contextParallel must divide the world size (nodes * gpusPerNode)",fieldPath=".parallelism.contextParallel"
// +kubebuilder:validation:XValidation:rule="!has(self.network.nicsPerNode) || self.network.nicsPerNode <= self.gpusPerNode",message="network.nicsPerNode must not exceed gpusPerNode (one NIC per GPU on a rails-only fabric)",fieldPath=".network.nicsPerNode"
// +kubebuilder:validation:XValidation:rule="oldSelf.suspend || (self.nodes == oldSelf.nodes && self.gpusPerNode == oldSelf.gpusPerNode && self.parallelism == oldSelf.parallelism && self.network == oldSelf.network && self.placement == oldSelf.placement)",message="nodes, gpusPerNode, parallelism, network and placement can change only while the job is suspended"
// +kubebuilder:validation:XValidation:rule="oldSelf.suspend || self.suspend || self.template == oldSelf.template",message="template can change only while the job is suspended (or in the write that suspends it, as Kueue's stop does)",fieldPath=".template"
// +kubebuilder:validation:XValidation:rule="has(self.checkpoint) == has(oldSelf.checkpoint) && (!has(self.checkpoint) || (self.checkpoint.volume == oldSelf.checkpoint.volume && self.checkpoint.mountPath == oldSelf.checkpoint.mountPath))",message="checkpoint.volume and mountPath are immutable: checkpoints must stay where the job can find them",fieldPath=".checkpoint"
// +kubebuilder:validation:XValidation:rule="!has(self.template.spec.nodeName) || self.nodes == 1 || self.placement.nodeSharing == 'Shared'",message="template.spec.nodeName pins every rank to one node: with nodes > 1 set placement.nodeSharing: Shared, or use a node selector",fieldPath=".template.spec.nodeName"
// +kubebuilder:validation:XValidation:rule="self.nodes == 1 || !has(self.checkpoint) || !has(self.checkpoint.volume.accessModes) || self.checkpoint.volume.accessModes.exists(m, m == 'ReadWriteMany')",message="checkpoint.volume.accessModes needs ReadWriteMany when nodes > 1: every rank, on its own node, writes its shard",fieldPath=".checkpoint.volume.accessModes"
// +kubebuilder:validation:XValidation:rule="!has(self.elastic) || self.elastic.minNodes <= self.nodes",message="elastic.minNodes must not exceed nodes",fieldPath=".elastic.minNodes"
// +kubebuilder:validation:XValidation:rule="!has(self.elastic) || self.parallelism.contextParallel < 1 || self.elastic.minNodes * self.gpusPerNode % self.parallelism.contextParallel == 0",message="elastic.minNodes * gpusPerNode must be a multiple of parallelism.contextParallel: a shrunk gang keeps its rings whole",fieldPath=".elastic.minNodes"
// +kubebuilder:validation:XValidation:rule="oldSelf.suspend || (has(self.elastic) == has(oldSelf.elastic) && (!has(self.elastic) || self.elastic == oldSelf.elastic))",message="elastic can change only while the job is suspended",fieldPath=".elastic"
// +kubebuilder:validation:XValidation:rule="has(self.managedBy) == has(oldSelf.managedBy) && (!has(self.managedBy) || self.managedBy == oldSelf.managedBy)",message="managedBy is immutable",fieldPath=".managedBy"
type ZayaTrainingJobSpec struct {
	// nodes is the number of worker pods, one per node (1 to 4096); pod r gets NODE_RANK r.
	// It can change only while the job is suspended.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4096
	// +required
	Nodes int32 `json:"nodes"`

	// gpusPerNode is how many amd.com/gpu each worker pod requests: 1 to 8, default 8 (a whole
	// MI300X node). It can change only while the job is suspended.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=8
	// +kubebuilder:default=8
	// +optional
	GPUsPerNode int32 `json:"gpusPerNode,omitempty"`

	// template is the worker pod. The operator adds the GPU and NIC requests, the rendezvous,
	// RCCL and checkpoint environment, the checkpoint volume, hostname and subdomain, so the
	// template must not set those (see docs/worker-contract.md). It needs at least one
	// container, restartPolicy Never or unset, and can change only while the job is suspended (or in the write that suspends it).
	// +kubebuilder:validation:XValidation:rule="!has(self.spec.restartPolicy) || self.spec.restartPolicy == 'Never'",message="template.spec.restartPolicy must be Never or unset: the operator restarts the whole gang",fieldPath=".spec.restartPolicy"
	// +kubebuilder:validation:XValidation:rule="!has(self.spec.hostname) && !has(self.spec.subdomain) && !has(self.spec.hostnameOverride)",message="template.spec.hostname, subdomain and hostnameOverride are set by the operator for rendezvous DNS (a hostnameOverride would give every rank the same name)",fieldPath=".spec"
	// +kubebuilder:validation:XValidation:rule="size(self.spec.containers) >= 1",message="template.spec.containers must hold at least one container",fieldPath=".spec.containers"
	// +required
	Template corev1.PodTemplateSpec `json:"template"`

	// parallelism groups ranks for model parallelism; by default ranks are not grouped.
	// It can change only while the job is suspended.
	// +kubebuilder:default={}
	// +optional
	Parallelism ParallelismSpec `json:"parallelism,omitempty"`

	// network selects how collectives are wired between nodes: the RCCL profile, NICs, RDMA
	// devices and extra environment. The default is the PollaraAINIC profile. It can change
	// only while the job is suspended.
	// +kubebuilder:default={}
	// +optional
	Network NetworkSpec `json:"network,omitempty"`

	// checkpoint is where and how often workers save state; without it every restart starts
	// training over. It cannot be added or removed after creation, and its volume is immutable.
	// +optional
	Checkpoint *CheckpointSpec `json:"checkpoint,omitempty"`

	// faultTolerance decides how failures are classified and how the gang is restarted: the
	// restart budget, backoff, hang detection and node quarantine. Every field has a default.
	// +kubebuilder:default={}
	// +optional
	FaultTolerance FaultToleranceSpec `json:"faultTolerance,omitempty"`

	// placement adds to the template's scheduling constraints: whether ranks may share a node
	// and an optional GPU node selector. It can change only while the job is suspended.
	// +kubebuilder:default={}
	// +optional
	Placement PlacementSpec `json:"placement,omitempty"`

	// elastic lets the job train on fewer nodes while a lost node cannot be replaced (no spare
	// and no free node for shrinkAfter), and grow back to nodes at a checkpoint once capacity
	// stands again (docs/recovery.md, "Elastic jobs"). The workers get the width of each run
	// (NNODES, WORLD_SIZE) and the target (ZAYA_TARGET_NODES). Unset (the default), the job
	// waits for all its nodes. It can change only while the job is suspended.
	// +optional
	Elastic *ElasticSpec `json:"elastic,omitempty"`

	// successPolicy says when the job has succeeded: Rank0 (default: rank 0 exits 0, as
	// torchrun and Megatron report completion) or AllRanks (every rank exits 0). Under Rank0
	// the other ranks get 30s to finish; pods still running then are deleted. An attempt in
	// which any rank failed or was stopped never succeeds.
	// +kubebuilder:default=Rank0
	// +optional
	SuccessPolicy SuccessPolicy `json:"successPolicy,omitempty"`

	// suspend deletes the job's pods while true (default false) and recreates them, resuming
	// from the last checkpoint, when set back to false. Checkpoints are kept; nodes,
	// gpusPerNode, parallelism, network, placement and template can change only while suspended.
	// +kubebuilder:default=false
	// +optional
	Suspend bool `json:"suspend,omitempty"`

	// ttlSecondsAfterFinished deletes the job this many seconds after it succeeds or fails
	// (0 deletes it at once). Unset keeps it forever.
	// +kubebuilder:validation:Minimum=0
	// +optional
	TTLSecondsAfterFinished *int32 `json:"ttlSecondsAfterFinished,omitempty"`

	// activeDeadlineSeconds fails the job once this many seconds have passed since
	// status.startTime, restarts included (1 to 315360000, ten years). Unset means no deadline.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=315360000
	// +optional
	ActiveDeadlineSeconds *int64 `json:"activeDeadlineSeconds,omitempty"`

	// managedBy names the controller that reconciles this job, as a domain-prefixed path of at
	// most 63 characters. Unset or "training.zaya.dev/zaya-operator" means this operator; any
	// other value makes this operator leave the job alone, but for "kueue.x-k8s.io/multikueue"
	// with a Kueue queue label and --kueue-workloads: the job then only gets its Workload
	// (MultiKueue runs it in a worker cluster, docs/kueue.md). Immutable.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[a-zA-Z0-9]([-a-zA-Z0-9_.]*[a-zA-Z0-9])?$`
	// +optional
	ManagedBy *string `json:"managedBy,omitempty"`
}

// ParallelismSpec groups ranks for model parallelism.
type ParallelismSpec struct {
	// contextParallel is the size of a ring-attention group: a sequence is sharded over this
	// many consecutive ranks (ZAYA_CONTEXT_PARALLEL). It must divide nodes * gpusPerNode;
	// 1 (the default) turns ring attention off.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=32768
	// +kubebuilder:default=1
	// +optional
	ContextParallel int32 `json:"contextParallel,omitempty"`
}

// ElasticSpec is the range a job may train at (docs/recovery.md, "Elastic jobs").
type ElasticSpec struct {
	// minNodes is the fewest nodes the job trains on, from 1 to nodes; minNodes × gpusPerNode
	// must be a multiple of parallelism.contextParallel. The gang shrinks to the most nodes it
	// still has that keep its rings whole, never below minNodes.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4096
	// +required
	MinNodes int32 `json:"minNodes"`

	// shrinkAfter is how long a rank may wait for a node (unschedulable: no spare and no free
	// node) before the gang restarts on the nodes it has, a duration from 10s to 24h (default
	// 2m).
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,7}([.][0-9]{1,9})?(ns|us|ms|s|m)|[0-9]{1,5}([.][0-9]{1,9})?h){1,4}$') && duration(self) >= duration('10s') && duration(self) <= duration('24h')",message="elastic.shrinkAfter must be a duration such as 90s, 30m or 1h30m, from 10s to 24h"
	// +kubebuilder:default="2m"
	// +optional
	ShrinkAfter *metav1.Duration `json:"shrinkAfter,omitempty"`

	// growAfter is how long the nodes a shrunk gang misses must stand ready before it grows
	// back, a duration from 10s to 24h (default 5m): the job holds them with pods as it holds
	// warm spares, so a node that comes and goes within growAfter is never grown onto. The
	// gang then grows at its next committed checkpoint.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,7}([.][0-9]{1,9})?(ns|us|ms|s|m)|[0-9]{1,5}([.][0-9]{1,9})?h){1,4}$') && duration(self) >= duration('10s') && duration(self) <= duration('24h')",message="elastic.growAfter must be a duration such as 90s, 30m or 1h30m, from 10s to 24h"
	// +kubebuilder:default="5m"
	// +optional
	GrowAfter *metav1.Duration `json:"growAfter,omitempty"`
}

// SuccessPolicy says which ranks must exit 0 for the job to succeed.
// +kubebuilder:validation:Enum=Rank0;AllRanks
type SuccessPolicy string

const (
	// SuccessRank0 completes the job when rank 0 exits 0.
	SuccessRank0 SuccessPolicy = "Rank0"
	// SuccessAllRanks completes the job when every rank has exited 0.
	SuccessAllRanks SuccessPolicy = "AllRanks"
)

// NodeSharing says whether ranks of one job may share a node.
// +kubebuilder:validation:Enum=Exclusive;Shared
type NodeSharing string

const (
	// NodeSharingExclusive keeps one rank per node (required pod anti-affinity when
	// gpusPerNode < 8; 8 GPUs fill a node anyway).
	NodeSharingExclusive NodeSharing = "Exclusive"
	// NodeSharingShared lets the scheduler pack several ranks on one node.
	NodeSharingShared NodeSharing = "Shared"
)

// GPUNodeSelector picks an automatic node selector for AMD GPU nodes.
// +kubebuilder:validation:Enum=None;NodeFeatureDiscovery
type GPUNodeSelector string

const (
	// GPUNodeSelectorNone adds no selector: the amd.com/gpu request alone places ranks.
	GPUNodeSelectorNone GPUNodeSelector = "None"
	// GPUNodeSelectorNFD requires feature.node.kubernetes.io/amd-gpu=true or
	// feature.node.kubernetes.io/amd-vgpu=true (set by Node Feature Discovery on AMD GPU nodes:
	// amd-vgpu where the GPUs are virtual functions passed to a virtual machine).
	GPUNodeSelectorNFD GPUNodeSelector = "NodeFeatureDiscovery"
)

// PlacementSpec shapes where ranks run. The template's nodeSelector, affinity, tolerations,
// priorityClassName and schedulerName are always honoured; these only add to them.
type PlacementSpec struct {
	// nodeSharing is Exclusive (default: at most one rank per node, by pod anti-affinity when
	// gpusPerNode < 8) or Shared (the scheduler may pack several ranks on one node).
	// +kubebuilder:default=Exclusive
	// +optional
	NodeSharing NodeSharing `json:"nodeSharing,omitempty"`

	// gpuNodeSelector is None (default: the amd.com/gpu request alone places ranks) or
	// NodeFeatureDiscovery, which requires Node Feature Discovery's AMD GPU label:
	// feature.node.kubernetes.io/amd-gpu=true, or amd-vgpu=true where the GPUs are virtual
	// functions (a cloud's GPU virtual servers), through required node affinity.
	// +kubebuilder:default=None
	// +optional
	GPUNodeSelector GPUNodeSelector `json:"gpuNodeSelector,omitempty"`
}

// NetworkProfile is a set of RCCL and socket settings for one kind of fabric.
// +kubebuilder:validation:Enum=PollaraAINIC;RoCE;Socket
type NetworkProfile string

const (
	// NetworkPollaraAINIC is AMD Pensando Pollara AI NICs on a rails-only fabric (ionic_* HCAs).
	NetworkPollaraAINIC NetworkProfile = "PollaraAINIC"
	// NetworkRoCE is a generic RoCEv2 fabric.
	NetworkRoCE NetworkProfile = "RoCE"
	// NetworkSocket uses TCP sockets only: fake-GPU and CPU clusters, laptops, CI.
	NetworkSocket NetworkProfile = "Socket"
)

// NetworkSpec selects the collective transport and its RCCL environment.
// +kubebuilder:validation:XValidation:rule="!has(self.profile) || self.profile != 'Socket' || !has(self.nicsPerNode) || self.nicsPerNode == 0",message="network.nicsPerNode must be 0 with the Socket profile",fieldPath=".nicsPerNode"
// +kubebuilder:validation:XValidation:rule="!has(self.profile) || self.profile != 'Socket' || !has(self.hcas)",message="network.hcas needs an RDMA profile (PollaraAINIC or RoCE)",fieldPath=".hcas"
type NetworkSpec struct {
	// profile picks the RCCL settings: PollaraAINIC (default; one Pollara NIC per GPU, rails
	// only), RoCE, or Socket (TCP only, for clusters without RDMA).
	// +kubebuilder:default=PollaraAINIC
	// +optional
	Profile NetworkProfile `json:"profile,omitempty"`

	// nicsPerNode is how many amd.com/nic each worker pod requests: 0 to 8, at most
	// gpusPerNode, and 0 with the Socket profile. Unset means gpusPerNode for PollaraAINIC
	// (one NIC per GPU) and 0 for RoCE and Socket.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=8
	// +optional
	NICsPerNode *int32 `json:"nicsPerNode,omitempty"`

	// hcas lists the RDMA devices for NCCL_IB_HCA, one per rail (at most 16, such as ionic_0 or
	// mlx5_0:1); not allowed with the Socket profile. Unset means ionic_0..ionic_N-1 for
	// PollaraAINIC and RCCL's own discovery for RoCE.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=32
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9_.-]+(:[0-9]+)?$`
	// +listType=set
	// +optional
	HCAs []string `json:"hcas,omitempty"`

	// socketIfname is the network interface RCCL and Gloo bootstrap over, matched exactly
	// (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME). Default eth0.
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.@-]{1,15}$`
	// +kubebuilder:default=eth0
	// +optional
	SocketIfname string `json:"socketIfname,omitempty"`

	// collectiveTimeout is how long a collective may stall before the worker gives up, a
	// duration from 1m to 24h (default 60m, ZAYA_COLLECTIVE_TIMEOUT). The default is well above
	// PyTorch's 10m so short fabric glitches do not kill a 1024-GPU job.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,7}([.][0-9]{1,9})?(ns|us|ms|s|m)|[0-9]{1,5}([.][0-9]{1,9})?h){1,4}$') && duration(self) >= duration('1m') && duration(self) <= duration('24h')",message="network.collectiveTimeout must be a duration such as 90s, 30m or 1h30m, from 1m to 24h"
	// +kubebuilder:default="60m"
	// +optional
	CollectiveTimeout *metav1.Duration `json:"collectiveTimeout,omitempty"`

	// ipcLock says whether the worker container gets the IPC_LOCK capability, which lets RDMA
	// pin memory past the container's locked-memory limit. Unset means yes for PollaraAINIC
	// and RoCE, no for Socket. Set false where the container runtime already allows unlimited
	// locked memory (RLIMIT_MEMLOCK, as RDMA-ready node images configure): Pod Security
	// baseline and restricted refuse IPC_LOCK. The capability only takes effect for workers
	// running as root; non-root workers rely on the runtime's limit either way.
	// +optional
	IPCLock *bool `json:"ipcLock,omitempty"`

	// env overrides or adds RCCL/NCCL variables (at most 64, values at most 4096 bytes); it
	// wins over the profile. Names must be C identifiers. Rendezvous variables (MASTER_ADDR,
	// RANK, WORLD_SIZE, PET_*, ZAYA_*, ...) belong to the operator and are refused.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.all(e, !has(e.value) || size(e.value) <= 4096)",message="network.env values must be at most 4096 bytes"
	// +kubebuilder:validation:XValidation:rule="self.all(e, !(e.name in ['MASTER_ADDR', 'MASTER_PORT', 'WORLD_SIZE', 'RANK', 'LOCAL_RANK', 'NODE_RANK', 'NNODES', 'GPUS_PER_NODE', 'LOCAL_WORLD_SIZE', 'GROUP_RANK']) && !e.name.startsWith('PET_') && !e.name.startsWith('ZAYA_'))",message="network.env must not set rendezvous variables (MASTER_*, RANK, LOCAL_RANK, GROUP_RANK, WORLD_SIZE, NODE_RANK, NNODES, *_WORLD_SIZE, GPUS_PER_NODE, PET_*, ZAYA_*)"
	// +listType=map
	// +listMapKey=name
	// +optional
	Env []corev1.EnvVar `json:"env,omitempty"`
}

// CheckpointSpec says where workers write checkpoints and how often.
type CheckpointSpec struct {
	// volume is the shared volume every rank writes its shard to: an existing claim
	// (claimName) or one the operator creates (size). Immutable.
	// +required
	Volume CheckpointVolume `json:"volume"`

	// mountPath is the absolute path the volume is mounted at in every worker, also passed as
	// ZAYA_CHECKPOINT_DIR. Default /checkpoints. It must be clean (no '.' or '..' segments,
	// '//' or trailing '/'), not '/', and not in /dev, /proc, /sys or /var/run/secrets.
	// Immutable, like the volume.
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="self.matches('^(/[^/:]+)+$') && !self.split('/').exists(p, p == '.' || p == '..') && ['/dev', '/proc', '/sys', '/var/run/secrets', '/run/secrets'].all(r, self != r && !self.startsWith(r + '/'))",message="checkpoint.mountPath must be a clean absolute path (no '.', '..', '//' or trailing '/'), not '/', and not in /dev, /proc, /sys or /var/run/secrets"
	// +kubebuilder:default="/checkpoints"
	// +optional
	MountPath string `json:"mountPath,omitempty"`

	// interval is how often workers save (ZAYA_CHECKPOINT_INTERVAL): every N steps or every
	// duration, default every 30m.
	// +kubebuilder:default={duration: "30m"}
	// +optional
	Interval *CheckpointInterval `json:"interval,omitempty"`

	// keep is how many committed checkpoints workers keep: 1 to 100, default 3. Older ones
	// are deleted only after a newer one is committed.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +kubebuilder:default=3
	// +optional
	Keep int32 `json:"keep,omitempty"`

	// retainOnDelete keeps a volume the operator created when the job is deleted (default
	// true, so checkpoints are never deleted by accident). A claimName volume is never deleted.
	// +kubebuilder:default=true
	// +optional
	RetainOnDelete *bool `json:"retainOnDelete,omitempty"`
}

// CheckpointVolume is either an existing PersistentVolumeClaim or one the operator creates.
// +kubebuilder:validation:XValidation:rule="has(self.claimName) != has(self.size)",message="checkpoint.volume needs exactly one of claimName (an existing PVC) or size (a PVC the operator creates)"
// +kubebuilder:validation:XValidation:rule="!has(self.claimName) || (!has(self.storageClassName) && !has(self.accessModes))",message="checkpoint.volume.storageClassName and accessModes apply only to a volume the operator creates (size), not to claimName",fieldPath=".claimName"
// +kubebuilder:validation:XValidation:rule="!has(self.size) || (type(self.size) == int ? self.size > 0 : !self.size.matches('^[+-]?([0-9]+([.][0-9]*)?|[.][0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]{1,2})?$') || quantity(self.size).isGreaterThan(quantity('0')))",message="checkpoint.volume.size must be greater than zero",fieldPath=".size"
type CheckpointVolume struct {
	// claimName is an existing PersistentVolumeClaim in the job's namespace, mounted by every
	// rank and never deleted by the operator. Set exactly one of claimName and size.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	// +optional
	ClaimName string `json:"claimName,omitempty"`

	// size asks the operator to create a PersistentVolumeClaim of this size (a quantity such
	// as 2Ti, greater than zero) named <job>-checkpoints. Set exactly one of claimName and size.
	// +optional
	Size *resource.Quantity `json:"size,omitempty"`

	// storageClassName is the class of the claim the operator creates (for IBM Cloud VPC file
	// storage, for example ibmc-vpc-file-3000-iops); only with size. Unset uses the cluster's
	// default class.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	// +optional
	StorageClassName *string `json:"storageClassName,omitempty"`

	// accessModes are the access modes of the claim the operator creates; only with size.
	// Unset means ReadWriteMany, since every rank mounts it.
	// +kubebuilder:validation:MaxItems=4
	// +kubebuilder:validation:items:Enum=ReadWriteOnce;ReadOnlyMany;ReadWriteMany;ReadWriteOncePod
	// +listType=set
	// +optional
	AccessModes []corev1.PersistentVolumeAccessMode `json:"accessModes,omitempty"`
}

// CheckpointInterval is exactly one of steps or duration.
// +kubebuilder:validation:XValidation:rule="has(self.steps) != has(self.duration)",message="checkpoint.interval needs exactly one of steps or duration"
type CheckpointInterval struct {
	// steps saves every this many training steps (1 to 1000000000). Set exactly one of steps
	// and duration.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000
	// +optional
	Steps *int32 `json:"steps,omitempty"`

	// duration saves at the first step boundary after this much time, a duration from 10s to
	// 168h such as 30m; rank 0's clock decides for all ranks. Set exactly one of steps and duration.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,7}([.][0-9]{1,9})?(ns|us|ms|s|m)|[0-9]{1,5}([.][0-9]{1,9})?h){1,4}$') && duration(self) >= duration('10s') && duration(self) <= duration('168h')",message="checkpoint.interval.duration must be a duration such as 90s, 30m or 1h30m, from 10s to 168h"
	// +optional
	Duration *metav1.Duration `json:"duration,omitempty"`
}

// ExitCodeAction is what a worker's non-zero exit code does to the job.
// +kubebuilder:validation:Enum=Restart;Fail
type ExitCodeAction string

const (
	// ExitCodeRestart restarts the gang from the last checkpoint.
	ExitCodeRestart ExitCodeAction = "Restart"
	// ExitCodeFail fails the job without a restart.
	ExitCodeFail ExitCodeAction = "Fail"
)

// DisruptionRestarts says whether restarts caused by the cluster count against maxRestarts.
// +kubebuilder:validation:Enum=Free;Counted
type DisruptionRestarts string

const (
	// DisruptionRestartsFree does not count eviction, preemption or drain restarts.
	DisruptionRestartsFree DisruptionRestarts = "Free"
	// DisruptionRestartsCounted counts them like any other failure.
	DisruptionRestartsCounted DisruptionRestarts = "Counted"
)

// QuarantineTaint is what the operator does to a quarantined node besides excluding it.
// +kubebuilder:validation:Enum=None;NoSchedule
type QuarantineTaint string

const (
	// QuarantineTaintNone only excludes the node from this job.
	QuarantineTaintNone QuarantineTaint = "None"
	// QuarantineTaintNoSchedule also taints the node training.zaya.dev/quarantined:NoSchedule.
	QuarantineTaintNoSchedule QuarantineTaint = "NoSchedule"
)

// FaultToleranceSpec is the recovery policy.
type FaultToleranceSpec struct {
	// maxRestarts is how many counted gang restarts may happen within restartWindow before
	// the job fails: 0 to 1000, default 10. 0 fails the job on its first failure.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	// +kubebuilder:default=10
	// +optional
	MaxRestarts *int32 `json:"maxRestarts,omitempty"`

	// userCodeRestarts is how many restarts failures of the program's own (failure category
	// UserCode: a traceback, an import error, bad arguments) may have within restartWindow, 0
	// to 7 (default 1); the next fails the job at once (reason UserCodeError) with the line
	// that shows it, instead of burning maxRestarts on a bug a restart cannot fix.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=7
	// +kubebuilder:default=1
	// +optional
	UserCodeRestarts *int32 `json:"userCodeRestarts,omitempty"`

	// restartWindow is the trailing window in which restarts count against maxRestarts, a
	// duration from 1m to 8760h (default 24h). Older restarts no longer use the budget, since
	// long runs fail every few hours and a lifetime budget would end them.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,7}([.][0-9]{1,9})?(ns|us|ms|s|m)|[0-9]{1,5}([.][0-9]{1,9})?h){1,4}$') && duration(self) >= duration('1m') && duration(self) <= duration('8760h')",message="faultTolerance.restartWindow must be a duration such as 90s, 30m or 1h30m, from 1m to 8760h"
	// +kubebuilder:default="24h"
	// +optional
	RestartWindow *metav1.Duration `json:"restartWindow,omitempty"`

	// backoff is the wait before each restart, doubling from initial (default 0s) up to max
	// (default 5m).
	// +kubebuilder:default={}
	// +optional
	Backoff BackoffSpec `json:"backoff,omitempty"`

	// hangTimeout restarts the gang when a worker that touches its heartbeat file
	// (ZAYA_HEARTBEAT_FILE) has not for this long, a duration from 30s to 24h (default 30m). It
	// is enforced by a liveness probe the operator adds unless the template has its own; a
	// worker that never touches the file is not judged by it.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,7}([.][0-9]{1,9})?(ns|us|ms|s|m)|[0-9]{1,5}([.][0-9]{1,9})?h){1,4}$') && duration(self) >= duration('30s') && duration(self) <= duration('24h')",message="faultTolerance.hangTimeout must be a duration such as 90s, 30m or 1h30m, from 30s to 24h"
	// +kubebuilder:default="30m"
	// +optional
	HangTimeout *metav1.Duration `json:"hangTimeout,omitempty"`

	// terminatingTimeout is how long a pod of an old attempt may stay Terminating (for example
	// on a dead node) before the operator force-deletes it, so the restart never waits on it.
	// A duration of at most 1h, default 2m.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,7}([.][0-9]{1,9})?(ns|us|ms|s|m)|[0-9]{1,5}([.][0-9]{1,9})?h){1,4}$') && duration(self) <= duration('1h')",message="faultTolerance.terminatingTimeout must be a duration such as 90s, 30m or 1h30m, at most 1h"
	// +kubebuilder:default="2m"
	// +optional
	TerminatingTimeout *metav1.Duration `json:"terminatingTimeout,omitempty"`

	// exitCodes classifies non-zero worker exit codes: fatal ones fail the job, the others
	// restart the gang. By default only 78 (configuration error) is fatal.
	// +kubebuilder:default={}
	// +optional
	ExitCodes ExitCodePolicy `json:"exitCodes,omitempty"`

	// disruptionRestarts says whether restarts after eviction, preemption or node drain
	// count against maxRestarts: Free (default) or Counted.
	// +kubebuilder:default=Free
	// +optional
	DisruptionRestarts DisruptionRestarts `json:"disruptionRestarts,omitempty"`

	// restartMode is how a gang restarts after a process fault on a healthy node: InPlace
	// (default) restarts the worker containers where they run (Kubernetes container restart
	// rules on the non-fatal exit codes: no pod is deleted or created); Recreate deletes and
	// recreates every pod. A cluster that drops or ignores the rules falls back to Recreate
	// on its own, and an in-place restart that does not converge within inPlaceTimeout is
	// escalated to Recreate.
	// +kubebuilder:default=InPlace
	// +optional
	RestartMode RestartMode `json:"restartMode,omitempty"`

	// inPlaceMechanism is what restarts a worker in its pod under restartMode InPlace.
	// RestartRules (default): the kubelet, by the worker container's restart rules
	// (Kubernetes 1.35 and later); on a cluster whose API server drops the rules the operator
	// finds out before it creates the pods and recreates the gang instead (an
	// InPlaceUnsupported event). Supervisor: the worker container runs its command under
	// zaya-supervisor, which applies the same rule inside the pod (pod restartPolicy
	// OnFailure), on any Kubernetes version; the image must use it as its entrypoint
	// (docs/worker-contract.md).
	// +kubebuilder:default=RestartRules
	// +optional
	InPlaceMechanism InPlaceMechanism `json:"inPlaceMechanism,omitempty"`

	// supervisor says whether the operator runs the worker container's command under
	// zaya-supervisor, so that any trainer (torchrun, a script) is stopped and restarted in
	// place within seconds when another rank of the gang fails, is lost or freezes (the gang
	// watch), and its progress file is served. Inject (default): where the operator is
	// installed with a supervisor image (the chart's supervisorImage) and the worker
	// container sets command, an init container copies the binary into an emptyDir and the
	// command becomes [/zaya/bin/zaya-supervisor, --, command...]; a command that already
	// starts with zaya-supervisor is left alone. Off: the command runs as written, and under
	// RestartRules the trainer must itself exit when a peer is lost (docs/worker-contract.md).
	// +kubebuilder:default=Inject
	// +optional
	Supervisor SupervisorInjection `json:"supervisor,omitempty"`

	// spares is how many warm spare pods the job holds under restartMode InPlace, 0 to 16
	// (default 0). A spare holds a node as a rank would (the template's placement, the worker
	// container's resources, its GPUs and NICs) and runs nothing; a rank whose pod is replaced
	// takes a spare's node at once instead of waiting for room, and the spare is replenished.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=16
	// +optional
	Spares int32 `json:"spares,omitempty"`

	// inPlaceTimeout is how long an in-place restart may take to bring every rank back
	// (restarted after the fault and ready) before the operator recreates the gang instead,
	// a duration from 10s to 1h (default 3m).
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,7}([.][0-9]{1,9})?(ns|us|ms|s|m)|[0-9]{1,5}([.][0-9]{1,9})?h){1,4}$') && duration(self) >= duration('10s') && duration(self) <= duration('1h')",message="faultTolerance.inPlaceTimeout must be a duration such as 90s, 30m or 1h30m, from 10s to 1h"
	// +kubebuilder:default="3m"
	// +optional
	InPlaceTimeout *metav1.Duration `json:"inPlaceTimeout,omitempty"`

	// quarantine keeps this job's ranks off nodes that were lost or had an unhealthy GPU or NIC,
	// for expireAfter (default 24h), at most maxNodes (default 32) at a time.
	// +kubebuilder:default={}
	// +optional
	Quarantine QuarantineSpec `json:"quarantine,omitempty"`

	// stragglers says when a rank counts as a straggler (its steps keep it busy longer than
	// the other ranks' median by marginPercent, over several of rank 0's progress reports) and
	// what is done about it: Report (default: the Straggling condition and an event naming
	// its node) or Replace (also, once a checkpoint is committed after it was found, its pod
	// is replaced away from its node, which this job quarantines).
	// +kubebuilder:default={}
	// +optional
	Stragglers StragglerSpec `json:"stragglers,omitempty"`
}

// StragglerSpec is the straggler policy (docs/recovery.md, "Stragglers").
type StragglerSpec struct {
	// marginPercent is how much longer than the others' median a rank's steps must keep it
	// busy for it to be a straggler, 5 to 1000 (default 25).
	// +kubebuilder:validation:Minimum=5
	// +kubebuilder:validation:Maximum=1000
	// +kubebuilder:default=25
	// +optional
	MarginPercent int32 `json:"marginPercent,omitempty"`
	// action is Report (default) or Replace.
	// +kubebuilder:default=Report
	// +optional
	Action StragglerAction `json:"action,omitempty"`
}

// StragglerAction is what the operator does about a straggler.
// +kubebuilder:validation:Enum=Report;Replace
type StragglerAction string

const (
	// StragglerActionReport only reports it: the Straggling condition and an event.
	StragglerActionReport StragglerAction = "Report"
	// StragglerActionReplace also replaces its pod at the next checkpoint.
	StragglerActionReplace StragglerAction = "Replace"
)

// RestartMode is how a gang restarts after a process fault.
// +kubebuilder:validation:Enum=InPlace;Recreate
type RestartMode string

const (
	// RestartModeInPlace restarts the worker containers in their pods.
	RestartModeInPlace RestartMode = "InPlace"
	// RestartModeRecreate deletes and recreates every pod of the gang.
	RestartModeRecreate RestartMode = "Recreate"
)

// InPlaceMechanism is what restarts a worker in its pod.
// +kubebuilder:validation:Enum=RestartRules;Supervisor
type InPlaceMechanism string

const (
	// InPlaceMechanismRestartRules restarts by container restart rules, in the kubelet.
	InPlaceMechanismRestartRules InPlaceMechanism = "RestartRules"
	// InPlaceMechanismSupervisor restarts by zaya-supervisor's rule in the worker container and
	// the pod's restartPolicy OnFailure.
	InPlaceMechanismSupervisor InPlaceMechanism = "Supervisor"
)

// SupervisorInjection says whether the operator wraps the worker's command in zaya-supervisor.
// +kubebuilder:validation:Enum=Inject;Off
type SupervisorInjection string

const (
	// SupervisorInject wraps the worker container's command, where the operator can.
	SupervisorInject SupervisorInjection = "Inject"
	// SupervisorOff runs the command as written.
	SupervisorOff SupervisorInjection = "Off"
)

// RestartMechanism is what restarts the gang after a process fault, as the operator set its
// pods up.
// +kubebuilder:validation:Enum=RestartRules;Supervisor;Recreate
type RestartMechanism string

const (
	// RestartMechanismRestartRules restarts in place, by container restart rules.
	RestartMechanismRestartRules RestartMechanism = "RestartRules"
	// RestartMechanismSupervisor restarts in place, by zaya-supervisor.
	RestartMechanismSupervisor RestartMechanism = "Supervisor"
	// RestartMechanismRecreate restarts with new pods (restartMode Recreate, or no in-place
	// mechanism).
	RestartMechanismRecreate RestartMechanism = "Recreate"
)

// BackoffSpec is an exponential backoff.
// +kubebuilder:validation:XValidation:rule="!has(self.initial) || !has(self.max) || !self.initial.matches('^([0-9]{1,7}([.][0-9]{1,9})?(ns|us|ms|s|m)|[0-9]{1,5}([.][0-9]{1,9})?h){1,4}$') || !self.max.matches('^([0-9]{1,7}([.][0-9]{1,9})?(ns|us|ms|s|m)|[0-9]{1,5}([.][0-9]{1,9})?h){1,4}$') || duration(self.initial) <= duration(self.max)",message="faultTolerance.backoff.initial must not exceed backoff.max"
type BackoffSpec struct {
	// initial is the wait before the first restart, a duration of at most 1h (default 0s:
	// restart at once).
	// It must not exceed max.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,7}([.][0-9]{1,9})?(ns|us|ms|s|m)|[0-9]{1,5}([.][0-9]{1,9})?h){1,4}$') && duration(self) <= duration('1h')",message="faultTolerance.backoff.initial must be a duration such as 90s, 30m or 1h30m, at most 1h"
	// +kubebuilder:default="0s"
	// +optional
	Initial *metav1.Duration `json:"initial,omitempty"`

	// max caps the wait before a restart, a duration of at most 1h (default 5m).
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,7}([.][0-9]{1,9})?(ns|us|ms|s|m)|[0-9]{1,5}([.][0-9]{1,9})?h){1,4}$') && duration(self) <= duration('1h')",message="faultTolerance.backoff.max must be a duration such as 90s, 30m or 1h30m, at most 1h"
	// +kubebuilder:default="5m"
	// +optional
	Max *metav1.Duration `json:"max,omitempty"`
}

// ExitCodePolicy classifies non-zero exit codes of worker containers. Exit code 0 means done.
// +kubebuilder:validation:XValidation:rule="!has(self.fatal) || !has(self.retryable) || self.fatal.all(c, !(c in self.retryable))",message="faultTolerance.exitCodes.fatal and retryable must not share a code"
type ExitCodePolicy struct {
	// fatal codes (1 to 255, at most 64) fail the job at once, since a bad configuration will
	// not fix itself. Default [78], the worker contract's configuration error; must not share a
	// code with retryable.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:Minimum=1
	// +kubebuilder:validation:items:Maximum=255
	// +kubebuilder:default={78}
	// +listType=set
	// +optional
	Fatal []int32 `json:"fatal,omitempty"`

	// retryable codes (1 to 255, at most 64) restart the gang from the last checkpoint,
	// whatever other says.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:Minimum=1
	// +kubebuilder:validation:items:Maximum=255
	// +listType=set
	// +optional
	Retryable []int32 `json:"retryable,omitempty"`

	// other is what any code in neither list does: Restart (default) or Fail.
	// +kubebuilder:default=Restart
	// +optional
	Other ExitCodeAction `json:"other,omitempty"`
}

// QuarantineSpec bounds and shapes the exclusion of failed nodes.
type QuarantineSpec struct {
	// nodeTaint is None (default: the node is only excluded from this job) or NoSchedule: a
	// node quarantined for a platform signal (its kubelet lost, a device its health signals
	// took away) is also tainted training.zaya.dev/quarantined=<namespace>.<job>:NoSchedule,
	// with an event, until expireAfter passes (at most the operator's --quarantine-taint-max,
	// 24h by default), when the operator removes it. What the job's own workers print, crash
	// or report never taints a node.
	// +kubebuilder:default=None
	// +optional
	NodeTaint QuarantineTaint `json:"nodeTaint,omitempty"`

	// expireAfter releases a quarantined node after this long, so a repaired node comes back;
	// a duration of at most 8760h, default 24h.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]{1,7}([.][0-9]{1,9})?(ns|us|ms|s|m)|[0-9]{1,5}([.][0-9]{1,9})?h){1,4}$') && duration(self) <= duration('8760h')",message="faultTolerance.quarantine.expireAfter must be a duration such as 90s, 30m or 1h30m, at most 8760h"
	// +kubebuilder:default="24h"
	// +optional
	ExpireAfter *metav1.Duration `json:"expireAfter,omitempty"`

	// maxNodes bounds the quarantine list (1 to 256, default 32); when it is full the oldest
	// entry is released.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=256
	// +kubebuilder:default=32
	// +optional
	MaxNodes int32 `json:"maxNodes,omitempty"`
}

// ZayaTrainingJobStatus is the observed state of a ZayaTrainingJob.
type ZayaTrainingJobStatus struct {
	// conditions are Created, Running, Restarting, WaitingForCapacity, Suspended, Succeeded and
	// Failed, kept most significant first so the STATUS column (the first True one) reads well.
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// observedGeneration is the metadata.generation of the spec this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// restarts is how many times the whole gang has been restarted, for any reason and by
	// either mode. restarts minus inPlaceRestarts is the current attempt number stamped on the
	// pods: an in-place restart keeps the pods.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000000
	// +optional
	Restarts int32 `json:"restarts"`

	// inPlaceRestarts is how many of the restarts happened in place, without new pods.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000000
	// +optional
	InPlaceRestarts int32 `json:"inPlaceRestarts,omitempty"`

	// lastRestartMode is how the latest (or current) restart happens: InPlace or Recreate.
	// +optional
	LastRestartMode RestartMode `json:"lastRestartMode,omitempty"`

	// restartMechanism is what restarts the gang after a process fault, as the pods the
	// operator creates are set up: RestartRules or Supervisor (in place), or Recreate
	// (restartMode Recreate, or a cluster that drops container restart rules).
	// +optional
	RestartMechanism RestartMechanism `json:"restartMechanism,omitempty"`

	// containerRestarts is the sum of the worker containers' restartCount over the current
	// attempt's pods when the operator last looked: a rise is an in-place restart.
	// +kubebuilder:validation:Minimum=0
	// +optional
	ContainerRestarts int64 `json:"containerRestarts,omitempty"`

	// rankRestarts is each rank's worker container restartCount, by rank, before the fault of
	// the in-place restart under way (or, between restarts, when the operator last looked;
	// omitted while every count is 0). The restart is over once every rank's count rose past
	// it: a count, unlike a start time in whole seconds, cannot be fooled by the clock.
	// +kubebuilder:validation:MaxItems=4096
	// +kubebuilder:validation:items:Minimum=0
	// +listType=atomic
	// +optional
	RankRestarts []int32 `json:"rankRestarts,omitempty"`

	// replacing are the ranks the in-place restart under way gives new pods because their own
	// pods cannot restart in place (their node failed, or the pod was evicted, deleted or did
	// not rejoin): each old pod, by UID, is deleted and a pod of the same name created on
	// another node, while every other rank restarts in place. Emptied when the restart ends.
	// +kubebuilder:validation:MaxItems=256
	// +listType=map
	// +listMapKey=rank
	// +optional
	Replacing []ReplacedPod `json:"replacing,omitempty"`

	// goodput is how much of the job's time went to training, and where the rest went.
	// +optional
	Goodput *GoodputStatus `json:"goodput,omitempty"`

	// readySpares is how many of the job's warm spare pods run, ready to be taken.
	// +kubebuilder:validation:Minimum=0
	// +optional
	ReadySpares int32 `json:"readySpares,omitempty"`

	// sparesTaken is how many warm spares replaced ranks have taken, over the job's life.
	// +kubebuilder:validation:Minimum=0
	// +optional
	SparesTaken int32 `json:"sparesTaken,omitempty"`

	// podsReplaced is how many pods in-place restarts have replaced, over the job's life.
	// +kubebuilder:validation:Minimum=0
	// +optional
	PodsReplaced int32 `json:"podsReplaced,omitempty"`

	// restartTimes are when the restarts that count against maxRestarts happened, pruned to
	// restartWindow; this is the restart budget, kept across operator restarts.
	// +kubebuilder:validation:MaxItems=1024
	// +listType=atomic
	// +optional
	RestartTimes []metav1.Time `json:"restartTimes,omitempty"`

	// currentNodes is how many nodes the gang of the current attempt has: spec.nodes, or fewer
	// while an elastic job trains shrunk.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4096
	// +optional
	CurrentNodes int32 `json:"currentNodes,omitempty"`

	// resizes is how many times an elastic job's gang changed its number of nodes.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Resizes int32 `json:"resizes,omitempty"`

	// growAtStep is the step the shrunk gang had reached when the nodes it misses had stood
	// ready for elastic.growAfter: it grows back once a checkpoint at or past this step is
	// committed. Unset while those nodes are not there.
	// +kubebuilder:validation:Minimum=0
	// +optional
	GrowAtStep *int64 `json:"growAtStep,omitempty"`

	// readyNodes is how many worker pods of the current attempt are Running and ready.
	// +kubebuilder:validation:Minimum=0
	// +optional
	ReadyNodes int32 `json:"readyNodes"`

	// lastFailure is the most recent failure that caused a restart or ended the job.
	// +optional
	LastFailure *JobFailure `json:"lastFailure,omitempty"`

	// recentFailures are the last failures (at most 8), newest first.
	// +kubebuilder:validation:MaxItems=8
	// +listType=atomic
	// +optional
	RecentFailures []JobFailure `json:"recentFailures,omitempty"`

	// quarantinedNodes are the nodes this job keeps its ranks off, until each one's
	// quarantine.expireAfter passes.
	// +kubebuilder:validation:MaxItems=256
	// +listType=map
	// +listMapKey=name
	// +optional
	QuarantinedNodes []QuarantinedNode `json:"quarantinedNodes,omitempty"`

	// lastCheckpoint is the newest checkpoint the workers reported as committed.
	// +optional
	LastCheckpoint *CheckpointStatus `json:"lastCheckpoint,omitempty"`

	// lastResume is what the workers of the latest attempt that reported it restored: the
	// checkpoint step, and newer steps that failed verification and were moved aside. Workers
	// report it in their termination messages, so it is known once a run of that restart ends:
	// after an in-place restart, when the next fault ends it or the job finishes.
	// +optional
	LastResume *ResumeStatus `json:"lastResume,omitempty"`

	// corruptCheckpoints are the latest committed steps the workers found corrupt and moved
	// aside, oldest first, each reported once with a CheckpointCorrupt warning whichever run
	// said it: a run restarted in place says so only as it ends, which may be after more
	// restarts than lastResume can attribute.
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	CorruptCheckpoints []CorruptCheckpoint `json:"corruptCheckpoints,omitempty"`

	// startTime is when the operator first created the job's pods (reset when a suspended
	// job resumes); activeDeadlineSeconds counts from it.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`

	// completionTime is when the job succeeded or failed.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`

	// lastRecoverySeconds is how long the last gang restart took, from the failure being seen
	// to all pods of the new attempt running (rounded up; metrics have sub-second detail).
	// +kubebuilder:validation:Minimum=0
	// +optional
	LastRecoverySeconds *int32 `json:"lastRecoverySeconds,omitempty"`
}

// ResumeStatus is what one attempt's workers restored.
type ResumeStatus struct {
	// attempt is status.restarts when the workers resumed: which restart's run this was.
	// +kubebuilder:validation:Minimum=0
	Attempt int32 `json:"attempt"`
	// step is the checkpoint step restored; 0 means training started from scratch.
	// +kubebuilder:validation:Minimum=0
	Step int64 `json:"step"`
	// corruptSteps are newer committed steps that failed verification and were moved aside,
	// newest first.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:Minimum=0
	// +listType=atomic
	// +optional
	CorruptSteps []int64 `json:"corruptSteps,omitempty"`
	// stepsLost is how many steps of committed training the corruption cost: the newest
	// corrupt step minus step.
	// +kubebuilder:validation:Minimum=0
	// +optional
	StepsLost int64 `json:"stepsLost,omitempty"`
}

// CorruptCheckpoint is one committed step that failed verification when the workers resumed.
type CorruptCheckpoint struct {
	// step is the committed step that failed.
	// +kubebuilder:validation:Minimum=0
	Step int64 `json:"step"`
	// movedTo is the directory beside the checkpoints it was moved to, kept for inspection
	// (corrupt-step-<step>-<time>); empty when only ranks other than 0 said so.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	MovedTo string `json:"movedTo,omitempty"`
	// reason is why it failed, as rank 0 said.
	// +kubebuilder:validation:MaxLength=512
	// +optional
	Reason string `json:"reason,omitempty"`
	// time is when the operator read the report.
	Time metav1.Time `json:"time"`
}

// JobFailure records one failure.
type JobFailure struct {
	// time is when the operator saw the failure.
	Time metav1.Time `json:"time"`
	// reason is a FailureReason, e.g. ExitCode, NodeLost, DeviceUnhealthy, Hang, Evicted.
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason"`
	// attempt is status.restarts when it failed: which restart's run failed (with in-place
	// restarts this is not the pods' attempt label).
	// +kubebuilder:validation:Minimum=0
	Attempt int32 `json:"attempt"`
	// node is the node of the failed rank, when known.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Node string `json:"node,omitempty"`
	// rank is the failed rank (NODE_RANK), when known.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Rank *int32 `json:"rank,omitempty"`
	// exitCode is the worker container's exit code, when it exited.
	// +optional
	ExitCode *int32 `json:"exitCode,omitempty"`
	// message says what happened, truncated to 1024 bytes.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Message string `json:"message,omitempty"`
	// category is what the failure was, read from its evidence: GPUHardware, NICFabric,
	// CollectiveTimeout, OutOfMemory, UserCode, Storage, PeerLost, Killed, NodeLost, Eviction,
	// Infrastructure, Hang, Straggler or Unknown (docs/recovery.md, "Why it failed").
	// +kubebuilder:validation:MaxLength=64
	// +optional
	Category string `json:"category,omitempty"`
	// rule is the failure pattern that named the category, when one did.
	// +kubebuilder:validation:MaxLength=63
	// +optional
	Rule string `json:"rule,omitempty"`
	// evidence is the line of the rank's termination message (or log tail) that the rule
	// matched, truncated to 512 bytes.
	// +kubebuilder:validation:MaxLength=512
	// +optional
	Evidence string `json:"evidence,omitempty"`
	// cascaded is how many other ranks had failed too when this one was taken for the root
	// cause (their collectives broke with it, or they timed out waiting for it); an in-place
	// restart counts the ranks its cascade restarted once it ends.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Cascaded int32 `json:"cascaded,omitempty"`
	// action is what the operator did about it: InPlace (the gang restarted in place),
	// ReplacedPods (the failed ranks got new pods while the others restarted in place),
	// Recreated (the whole gang was made again) or FailedJob (the job failed).
	// +optional
	Action FailureAction `json:"action,omitempty"`
	// recovery is when each stage of the way back from this failure happened, from real
	// timestamps; set by operators since this field, for the failures they restart from.
	// +optional
	Recovery *RecoveryTimeline `json:"recovery,omitempty"`
}

// RecoveryTimeline is when each stage of a recovery happened: the gang's last step, the
// operator's detection and decision, every rank of the new attempt running, and rank 0's
// new run starting, meeting its peers and training. Each is a real clock's reading (the
// operator's, the kubelet's, or rank 0's report of its own run, kept within the recovery);
// a stage not reached or not known is absent. docs/recovery.md, "A recovery's timeline".
type RecoveryTimeline struct {
	// lastStep is when the gang last finished a step before the fault: the stopped ranks'
	// or rank 0's word, else when the operator saw the failure.
	// +optional
	LastStep *metav1.MicroTime `json:"lastStep,omitempty"`
	// detected is when the operator recorded the failure.
	// +optional
	Detected *metav1.MicroTime `json:"detected,omitempty"`
	// decided is when it chose what to do about it (the failure's action).
	// +optional
	Decided *metav1.MicroTime `json:"decided,omitempty"`
	// running is when every rank of the new attempt ran: its containers back in place, or
	// its new pods scheduled and started.
	// +optional
	Running *metav1.MicroTime `json:"running,omitempty"`
	// workerStarted is when rank 0's new worker process started, as its report says.
	// +optional
	WorkerStarted *metav1.MicroTime `json:"workerStarted,omitempty"`
	// rendezvous is when rank 0's new run had met its peers, as its report says (under
	// zaya-supervisor: the trainer's first report, once it met them and resumed).
	// +optional
	Rendezvous *metav1.MicroTime `json:"rendezvous,omitempty"`
	// training is when the new run trained again: past its resume point by the workers'
	// word, else when every rank ran.
	// +optional
	Training *metav1.MicroTime `json:"training,omitempty"`
}

// FailureAction is what the operator did about a failure.
// +kubebuilder:validation:Enum=InPlace;ReplacedPods;Recreated;FailedJob
type FailureAction string

// What the operator does about a failure.
const (
	FailureActionInPlace      FailureAction = "InPlace"
	FailureActionReplacedPods FailureAction = "ReplacedPods"
	FailureActionRecreated    FailureAction = "Recreated"
	FailureActionFailedJob    FailureAction = "FailedJob"
)

// GoodputStatus is how much of a job's time went to training (docs/recovery.md, "Goodput").
// Times are milliseconds: a chaos test's restarts take seconds.
type GoodputStatus struct {
	// asOf is when these figures were brought up to date: at each start, restart, recovery,
	// suspension and completion.
	AsOf metav1.MicroTime `json:"asOf"`
	// wallMilliseconds is how long the job has been started (suspensions excluded), up to asOf.
	// +kubebuilder:validation:Minimum=0
	WallMilliseconds int64 `json:"wallMilliseconds"`
	// startupMilliseconds is the time from each start or resume until the job first trained
	// (until every rank ran, where the workers do not report their progress).
	// +kubebuilder:validation:Minimum=0
	// +optional
	StartupMilliseconds int64 `json:"startupMilliseconds,omitempty"`
	// lostMilliseconds is the time failures cost: from each failure (when training last
	// advanced) until the job trained again, plus the steps trained again since the
	// checkpoint the gang resumed from.
	// +kubebuilder:validation:Minimum=0
	// +optional
	LostMilliseconds int64 `json:"lostMilliseconds,omitempty"`
	// trainingMilliseconds is the wall time less startup and lost.
	// +kubebuilder:validation:Minimum=0
	// +optional
	TrainingMilliseconds int64 `json:"trainingMilliseconds,omitempty"`
	// effectiveTrainingTime is training over wall time, as a percentage: "95.3%".
	// +kubebuilder:validation:MaxLength=8
	// +optional
	EffectiveTrainingTime string `json:"effectiveTrainingTime,omitempty"`
	// lost is lostMilliseconds by failure category.
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	Lost []GoodputLoss `json:"lost,omitempty"`
	// open is the time being lost now, not yet in the figures: since the job started or a
	// failure stopped training, until it trains again.
	// +optional
	Open *GoodputOpen `json:"open,omitempty"`
	// trainingSince is when the job last began training again (after its start or a failure).
	// +optional
	TrainingSince *metav1.MicroTime `json:"trainingSince,omitempty"`
	// history is the job's latest starts and losses, closed, oldest first (the newest
	// MaxGoodputHistory): the time between them trained. `kubectl zaya goodput` draws it.
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	// +optional
	History []GoodputSpan `json:"history,omitempty"`
}

// MaxGoodputHistory bounds status.goodput.history.
const MaxGoodputHistory = 32

// GoodputSpan is one start or loss, from when training last advanced (the start, for a start)
// until the job trained again.
type GoodputSpan struct {
	// category is the failure's category; empty for a start.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	Category string `json:"category,omitempty"`
	// since is when it began.
	Since metav1.MicroTime `json:"since"`
	// until is when the job trained again.
	Until metav1.MicroTime `json:"until"`
	// recomputeMilliseconds is what the steps trained again after it cost.
	// +kubebuilder:validation:Minimum=0
	// +optional
	RecomputeMilliseconds int64 `json:"recomputeMilliseconds,omitempty"`
	// nodes is how many nodes the gang trained on after it (status.currentNodes then):
	// fewer than spec.nodes while an elastic job was shrunk.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4096
	// +optional
	Nodes int32 `json:"nodes,omitempty"`
}

// GoodputOpen is a start or a failure whose cost is still running.
type GoodputOpen struct {
	// category is the failure's category; empty for a start.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	Category string `json:"category,omitempty"`
	// since is when training last advanced before the failure (the start, for a start).
	Since metav1.MicroTime `json:"since"`
	// reachedStep is the furthest step trained before the failure: the steps past the
	// checkpoint resumed from are trained again.
	// +kubebuilder:validation:Minimum=0
	// +optional
	ReachedStep int64 `json:"reachedStep,omitempty"`
	// checkpointStep is the newest checkpoint committed before the failure.
	// +kubebuilder:validation:Minimum=0
	// +optional
	CheckpointStep int64 `json:"checkpointStep,omitempty"`
	// stepMicroseconds is the pace then, which prices them.
	// +kubebuilder:validation:Minimum=0
	// +optional
	StepMicroseconds int64 `json:"stepMicroseconds,omitempty"`
	// ranAt is when every rank ran again: the end of the loss where the workers never say
	// when they trained again.
	// +optional
	RanAt *metav1.MicroTime `json:"ranAt,omitempty"`
}

// GoodputLoss is the time failures of one category cost.
type GoodputLoss struct {
	// category is the failure category (lastFailure.category).
	// +kubebuilder:validation:MaxLength=64
	Category string `json:"category"`
	// failures is how many root failures of the category there were.
	// +kubebuilder:validation:Minimum=0
	Failures int32 `json:"failures"`
	// downMilliseconds is the time from each failure until the job trained again.
	// +kubebuilder:validation:Minimum=0
	// +optional
	DownMilliseconds int64 `json:"downMilliseconds,omitempty"`
	// recomputeMilliseconds is what the steps trained again cost (steps past the checkpoint
	// the gang resumed from, at the workers' reported pace).
	// +kubebuilder:validation:Minimum=0
	// +optional
	RecomputeMilliseconds int64 `json:"recomputeMilliseconds,omitempty"`
}

// ReplacedPod is a rank whose pod an in-place restart replaces.
type ReplacedPod struct {
	// rank is the replaced rank (NODE_RANK).
	// +kubebuilder:validation:Minimum=0
	Rank int32 `json:"rank"`
	// uid is the old pod's UID: that pod is deleted, a pod of the same name is the new one.
	// +kubebuilder:validation:MaxLength=128
	UID string `json:"uid"`
	// node is the node the old pod ran on.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Node string `json:"node,omitempty"`
	// reason is the FailureReason that has the pod replaced.
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason"`
	// since is when the operator decided to replace it.
	Since metav1.Time `json:"since"`
	// spareNode is the node of the warm spare the new pod takes, if one was held.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	// +optional
	SpareNode string `json:"spareNode,omitempty"`
}

// QuarantinedNode is a node the job keeps its ranks off.
type QuarantinedNode struct {
	// name is the quarantined node's name.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Name string `json:"name"`
	// reason is the FailureReason that put it here.
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason"`
	// since is when it was quarantined; it is released after quarantine.expireAfter.
	Since metav1.Time `json:"since"`
}

// CheckpointStatus is a committed checkpoint reported by the workers.
type CheckpointStatus struct {
	// step is the training step of the checkpoint.
	// +kubebuilder:validation:Minimum=0
	Step int64 `json:"step"`
	// time is when the operator learned of it.
	// +optional
	Time *metav1.Time `json:"time,omitempty"`
}

// ZayaTrainingJob is a distributed training job on AMD Instinct GPUs that the operator keeps
// alive: one worker pod per node, RCCL rails wired, whole-gang restarts from the last
// checkpoint, away from bad nodes.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ztj,categories=all;zaya
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.spec.nodes`
// +kubebuilder:printcolumn:name="GPUs/Node",type=integer,JSONPath=`.spec.gpusPerNode`
// +kubebuilder:printcolumn:name="Current",type=integer,JSONPath=`.status.currentNodes`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyNodes`
// +kubebuilder:printcolumn:name="Restarts",type=integer,JSONPath=`.status.restarts`
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.conditions[?(@.status=="True")].type`
// +kubebuilder:printcolumn:name="Checkpoint",type=integer,JSONPath=`.status.lastCheckpoint.step`
// +kubebuilder:printcolumn:name="Goodput",type=string,JSONPath=`.status.goodput.effectiveTrainingTime`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 50",message="metadata.name must be at most 50 characters so worker hostnames (<name>-<rank>) fit a DNS label"
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name must be a DNS-1035 label (lower-case letters, digits, '-', starting with a letter): it names the rendezvous Service"
type ZayaTrainingJob struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired state of the training job.
	// +required
	Spec ZayaTrainingJobSpec `json:"spec"`

	// status is the job's observed state, written by the operator.
	// +optional
	Status ZayaTrainingJobStatus `json:"status,omitempty"`
}

// ZayaTrainingJobList is a list of ZayaTrainingJobs.
// +kubebuilder:object:root=true
type ZayaTrainingJobList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ZayaTrainingJob `json:"items"`
}
