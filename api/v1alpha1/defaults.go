package v1alpha1

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// Default values. The CRD's +kubebuilder:default markers carry the same values; an
// integration test checks that the apiserver and Default agree.
const (
	DefaultGPUsPerNode        = 8
	DefaultContextParallel    = 1
	DefaultNetworkProfile     = NetworkPollaraAINIC
	DefaultSocketIfname       = "eth0"
	DefaultCollectiveTimeout  = 60 * time.Minute
	DefaultCheckpointPath     = "/checkpoints"
	DefaultCheckpointInterval = 30 * time.Minute
	DefaultCheckpointKeep     = 3
	DefaultMaxRestarts        = 10
	DefaultUserCodeRestarts   = 1
	// DefaultStragglerMarginPercent is faultTolerance.stragglers.marginPercent's default.
	DefaultStragglerMarginPercent = 25
	DefaultRestartWindow          = 24 * time.Hour
	DefaultBackoffInitial         = 0 * time.Second
	DefaultBackoffMax             = 5 * time.Minute
	DefaultHangTimeout            = 30 * time.Minute
	DefaultTerminatingTimeout     = 2 * time.Minute
	DefaultInPlaceTimeout         = 3 * time.Minute
	DefaultQuarantineExpiry       = 24 * time.Hour
	DefaultQuarantineMaxNodes     = 32
	DefaultShrinkAfter            = 2 * time.Minute
	DefaultGrowAfter              = 5 * time.Minute
)

// Default fills unset fields with the values the CRD schema defaults them to, so code that
// builds jobs in Go (tests, the fake client) sees what the apiserver would store.
func (j *ZayaTrainingJob) Default() {
	s := &j.Spec
	if s.GPUsPerNode == 0 {
		s.GPUsPerNode = DefaultGPUsPerNode
	}
	if s.Parallelism.ContextParallel == 0 {
		s.Parallelism.ContextParallel = DefaultContextParallel
	}

	if s.Placement.NodeSharing == "" {
		s.Placement.NodeSharing = NodeSharingExclusive
	}
	if s.Placement.GPUNodeSelector == "" {
		s.Placement.GPUNodeSelector = GPUNodeSelectorNone
	}
	if s.SuccessPolicy == "" {
		s.SuccessPolicy = SuccessRank0
	}

	n := &s.Network
	if n.Profile == "" {
		n.Profile = DefaultNetworkProfile
	}
	if n.SocketIfname == "" {
		n.SocketIfname = DefaultSocketIfname
	}
	defaultDuration(&n.CollectiveTimeout, DefaultCollectiveTimeout)

	if c := s.Checkpoint; c != nil {
		if c.MountPath == "" {
			c.MountPath = DefaultCheckpointPath
		}
		if c.Interval == nil {
			c.Interval = &CheckpointInterval{Duration: &metav1.Duration{Duration: DefaultCheckpointInterval}}
		}
		if c.Keep == 0 {
			c.Keep = DefaultCheckpointKeep
		}
		if c.RetainOnDelete == nil {
			c.RetainOnDelete = ptr.To(true)
		}
	}

	if e := s.Elastic; e != nil {
		defaultDuration(&e.ShrinkAfter, DefaultShrinkAfter)
		defaultDuration(&e.GrowAfter, DefaultGrowAfter)
	}

	f := &s.FaultTolerance
	if f.MaxRestarts == nil {
		f.MaxRestarts = ptr.To[int32](DefaultMaxRestarts)
	}
	if f.UserCodeRestarts == nil {
		f.UserCodeRestarts = ptr.To[int32](DefaultUserCodeRestarts)
	}
	defaultDuration(&f.RestartWindow, DefaultRestartWindow)
	defaultDuration(&f.Backoff.Initial, DefaultBackoffInitial)
	defaultDuration(&f.Backoff.Max, DefaultBackoffMax)
	defaultDuration(&f.HangTimeout, DefaultHangTimeout)
	defaultDuration(&f.TerminatingTimeout, DefaultTerminatingTimeout)
	if f.RestartMode == "" {
		f.RestartMode = RestartModeInPlace
	}
	if f.InPlaceMechanism == "" {
		f.InPlaceMechanism = InPlaceMechanismRestartRules
	}
	if f.Supervisor == "" {
		f.Supervisor = SupervisorInject
	}
	defaultDuration(&f.InPlaceTimeout, DefaultInPlaceTimeout)
	if f.Stragglers.MarginPercent == 0 {
		f.Stragglers.MarginPercent = DefaultStragglerMarginPercent
	}
	if f.Stragglers.Action == "" {
		f.Stragglers.Action = StragglerActionReport
	}
	if f.ExitCodes.Fatal == nil {
		f.ExitCodes.Fatal = []int32{ExitCodeConfigError}
	}
	if f.ExitCodes.Other == "" {
		f.ExitCodes.Other = ExitCodeRestart
	}
	if f.DisruptionRestarts == "" {
		f.DisruptionRestarts = DisruptionRestartsFree
	}
	q := &f.Quarantine
	if q.NodeTaint == "" {
		q.NodeTaint = QuarantineTaintNone
	}
	defaultDuration(&q.ExpireAfter, DefaultQuarantineExpiry)
	if q.MaxNodes == 0 {
		q.MaxNodes = DefaultQuarantineMaxNodes
	}
}

func defaultDuration(d **metav1.Duration, v time.Duration) {
	if *d == nil {
		*d = &metav1.Duration{Duration: v}
	}
}

// Attempt is the attempt number of the current pods: every restart but the in-place ones
// moved it.
func (s *ZayaTrainingJobStatus) Attempt() int32 {
	return s.Restarts - s.InPlaceRestarts
}

// Width is how many nodes the gang of the current attempt has: status.currentNodes while an
// elastic job is shrunk (read only within elastic.minNodes..nodes and as whole rings: a status
// written by hand cannot make a gang of another shape), else spec.nodes.
func (j *ZayaTrainingJob) Width() int32 {
	e, n := j.Spec.Elastic, j.Status.CurrentNodes
	cp := int64(max(j.Spec.Parallelism.ContextParallel, 1))
	if e == nil || n < max(e.MinNodes, 1) || n >= j.Spec.Nodes || int64(n)*int64(j.Spec.GPUsPerNode)%cp != 0 {
		return j.Spec.Nodes
	}
	return n
}

// WorldSize is the number of training ranks at full width: nodes * gpusPerNode.
func (s *ZayaTrainingJobSpec) WorldSize() int32 {
	return s.Nodes * s.GPUsPerNode
}

// NICsPerNode is the number of amd.com/nic each worker requests: the explicit value, or
// one per GPU on Pollara rails and none otherwise.
func (s *ZayaTrainingJobSpec) NICsPerNode() int32 {
	if s.Network.NICsPerNode != nil {
		return *s.Network.NICsPerNode
	}
	if s.Network.Profile == NetworkPollaraAINIC {
		return s.GPUsPerNode
	}
	return 0
}

// HCAs is the NCCL_IB_HCA device list: the explicit list, or ionic_0..ionic_{n-1} for
// Pollara rails (n = NICsPerNode), or nil to let RCCL discover devices.
func (s *ZayaTrainingJobSpec) HCAs() []string {
	if len(s.Network.HCAs) > 0 {
		return s.Network.HCAs
	}
	if s.Network.Profile != NetworkPollaraAINIC {
		return nil
	}
	n := s.NICsPerNode()
	hcas := make([]string, 0, max(n, 0)) // the CRD refuses n < 0; never panic on it
	for i := range n {
		hcas = append(hcas, fmt.Sprintf("ionic_%d", i))
	}
	return hcas
}

// CheckpointAccessModes are the access modes of a claim the operator creates.
func (c *CheckpointVolume) CheckpointAccessModes() []corev1.PersistentVolumeAccessMode {
	if len(c.AccessModes) > 0 {
		return c.AccessModes
	}
	return []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
}

// ManagedByOperator reports whether this operator reconciles the job (spec.managedBy is
// unset or names this operator).
func (j *ZayaTrainingJob) ManagedByOperator() bool {
	return j.Spec.ManagedBy == nil || *j.Spec.ManagedBy == ControllerName
}
