package v1alpha1_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	. "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

func dur(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }

func TestDefaultFillsEveryDefaultedField(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("j", "ns").NewCheckpoint("1Ti", "").Obj()
	job.Default()

	want := testjob.MakeZayaTrainingJob("j", "ns").NewCheckpoint("1Ti", "").Obj().Spec
	want.GPUsPerNode = 8
	want.Parallelism.ContextParallel = 1
	want.Placement = PlacementSpec{NodeSharing: NodeSharingExclusive, GPUNodeSelector: GPUNodeSelectorNone}
	want.SuccessPolicy = SuccessRank0
	want.Network = NetworkSpec{Profile: NetworkPollaraAINIC, SocketIfname: "eth0", CollectiveTimeout: dur(time.Hour)}
	want.Checkpoint.MountPath = "/checkpoints"
	want.Checkpoint.Interval = &CheckpointInterval{Duration: dur(30 * time.Minute)}
	want.Checkpoint.Keep = 3
	want.Checkpoint.RetainOnDelete = ptr.To(true)
	want.FaultTolerance = FaultToleranceSpec{
		MaxRestarts:        ptr.To[int32](10),
		UserCodeRestarts:   ptr.To[int32](1),
		RestartWindow:      dur(24 * time.Hour),
		Backoff:            BackoffSpec{Initial: dur(0), Max: dur(5 * time.Minute)},
		HangTimeout:        dur(30 * time.Minute),
		TerminatingTimeout: dur(2 * time.Minute),
		ExitCodes:          ExitCodePolicy{Fatal: []int32{78}, Other: ExitCodeRestart},
		DisruptionRestarts: DisruptionRestartsFree,
		RestartMode:        RestartModeInPlace,
		InPlaceMechanism:   InPlaceMechanismRestartRules,
		Supervisor:         SupervisorInject,
		InPlaceTimeout:     dur(3 * time.Minute),
		Quarantine:         QuarantineSpec{NodeTaint: QuarantineTaintNone, ExpireAfter: dur(24 * time.Hour), MaxNodes: 32},
		Stragglers:         StragglerSpec{MarginPercent: 25, Action: StragglerActionReport},
	}
	if diff := cmp.Diff(want, job.Spec); diff != "" {
		t.Errorf("Default() mismatch (-want +got):\n%s", diff)
	}

	again := job.DeepCopy()
	again.Default()
	if diff := cmp.Diff(job, again); diff != "" {
		t.Errorf("Default() is not idempotent (-first +second):\n%s", diff)
	}
}

func TestDefaultKeepsExplicitValues(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("j", "ns").GPUsPerNode(2).ContextParallel(4).
		Profile(NetworkSocket).ClaimCheckpoint("ckpt").Obj()
	job.Spec.Checkpoint.Interval = &CheckpointInterval{Steps: ptr.To[int32](100)}
	job.Spec.Checkpoint.RetainOnDelete = ptr.To(false)
	job.Spec.FaultTolerance.MaxRestarts = ptr.To[int32](0)
	job.Spec.FaultTolerance.ExitCodes.Fatal = []int32{}
	job.Spec.Network.SocketIfname = "lo"
	before := job.DeepCopy()
	job.Default()

	checks := []struct {
		name      string
		got, want any
	}{
		{"gpusPerNode", job.Spec.GPUsPerNode, before.Spec.GPUsPerNode},
		{"contextParallel", job.Spec.Parallelism.ContextParallel, int32(4)},
		{"profile", job.Spec.Network.Profile, NetworkSocket},
		{"socketIfname", job.Spec.Network.SocketIfname, "lo"},
		{"interval.steps", *job.Spec.Checkpoint.Interval.Steps, int32(100)},
		{"interval.duration unset beside steps", job.Spec.Checkpoint.Interval.Duration, (*metav1.Duration)(nil)},
		{"retainOnDelete", *job.Spec.Checkpoint.RetainOnDelete, false},
		{"maxRestarts 0 is kept", *job.Spec.FaultTolerance.MaxRestarts, int32(0)},
		{"explicitly empty fatal list is kept", job.Spec.FaultTolerance.ExitCodes.Fatal, []int32{}},
	}
	for _, c := range checks {
		if diff := cmp.Diff(c.want, c.got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", c.name, diff)
		}
	}
}

func TestNICsAndHCAsPerProfile(t *testing.T) {
	cases := []struct {
		name     string
		job      *ZayaTrainingJob
		wantNICs int32
		wantHCAs []string
	}{
		{"pollara: one NIC per GPU", testjob.MakeZayaTrainingJob("j", "ns").Defaulted().Obj(), 8,
			[]string{"ionic_0", "ionic_1", "ionic_2", "ionic_3", "ionic_4", "ionic_5", "ionic_6", "ionic_7"}},
		{"pollara with 4 GPUs", testjob.MakeZayaTrainingJob("j", "ns").GPUsPerNode(4).Defaulted().Obj(), 4,
			[]string{"ionic_0", "ionic_1", "ionic_2", "ionic_3"}},
		{"pollara with explicit NICs", testjob.MakeZayaTrainingJob("j", "ns").NICsPerNode(2).Defaulted().Obj(), 2,
			[]string{"ionic_0", "ionic_1"}},
		{"roce discovers HCAs", testjob.MakeZayaTrainingJob("j", "ns").Profile(NetworkRoCE).Defaulted().Obj(), 0, nil},
		{"socket has none", testjob.MakeZayaTrainingJob("j", "ns").Profile(NetworkSocket).Defaulted().Obj(), 0, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.job.Spec.NICsPerNode(); got != c.wantNICs {
				t.Errorf("NICsPerNode() = %d, want %d", got, c.wantNICs)
			}
			if diff := cmp.Diff(c.wantHCAs, c.job.Spec.HCAs()); diff != "" {
				t.Errorf("HCAs() (-want +got):\n%s", diff)
			}
		})
	}

	explicit := testjob.MakeZayaTrainingJob("j", "ns").Profile(NetworkRoCE).Defaulted().Obj()
	explicit.Spec.Network.HCAs = []string{"mlx5_0:1", "mlx5_1:1"}
	if diff := cmp.Diff([]string{"mlx5_0:1", "mlx5_1:1"}, explicit.Spec.HCAs()); diff != "" {
		t.Errorf("explicit HCAs (-want +got):\n%s", diff)
	}
}

func TestWorldSizeAndOwnership(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("j", "ns").Nodes(128).Defaulted().Obj()
	if got := job.Spec.WorldSize(); got != 1024 {
		t.Errorf("WorldSize() = %d, want 1024", got)
	}
	if !job.ManagedByOperator() {
		t.Error("a job without managedBy must be ours")
	}
	if !testjob.MakeZayaTrainingJob("j", "ns").ManagedBy(ControllerName).Obj().ManagedByOperator() {
		t.Error("managedBy naming this operator must be ours")
	}
	if testjob.MakeZayaTrainingJob("j", "ns").ManagedBy("kueue.x-k8s.io/multikueue").Obj().ManagedByOperator() {
		t.Error("a job managed by MultiKueue must be left alone")
	}
}

func TestCheckpointAccessModes(t *testing.T) {
	v := CheckpointVolume{}
	if diff := cmp.Diff([]corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}, v.CheckpointAccessModes()); diff != "" {
		t.Errorf("default access modes (-want +got):\n%s", diff)
	}
	v.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	if diff := cmp.Diff([]corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, v.CheckpointAccessModes()); diff != "" {
		t.Errorf("explicit access modes (-want +got):\n%s", diff)
	}
}
