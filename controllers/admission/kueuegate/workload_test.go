package kueuegate

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
	"github.com/zaya-operator/zaya-operator/internal/kueue"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// podSets are the job's pod sets from its pods as the core renders them for the admission:
// rank 0 with the supervisor where it gets one, a spare where the job holds some.
func podSets(job *trainingv1alpha1.ZayaTrainingJob, supervisorImage string) []kueue.PodSet {
	base := &trainingv1alpha1.ZayaTrainingJob{ObjectMeta: job.ObjectMeta, Spec: job.Spec}
	rank := workerpod.Render(base, nil, 0)
	workerpod.InjectSupervisor(base, rank, supervisorImage)
	var spare *corev1.Pod
	n := min(max(job.Spec.FaultTolerance.Spares, 0), 16)
	if n > 0 {
		spare = rank.DeepCopy()
		spare.Spec.Containers = spare.Spec.Containers[:1]
	}
	return workloadPodSets(job, rank, spare, n)
}

func TestWorkloadPodSetsDependOnTheSpecAlone(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(4).Label(kueue.QueueNameLabel, "team").Defaulted().Obj()
	job.UID = "u1"
	base := podSetsHash(podSets(job, ""))

	// What a restart changes (attempt, quarantined nodes, failures) asks Kueue for nothing new.
	later := job.DeepCopy()
	later.Status.Restarts = 7
	later.Status.QuarantinedNodes = []trainingv1alpha1.QuarantinedNode{{Name: "bad-node", Reason: "DeviceUnhealthy", Since: metav1.Now()}}
	if got := podSetsHash(podSets(later, "")); got != base {
		t.Error("the pod sets changed with the job's status: a restart would leave the admission")
	}
	sets := podSets(later, "")
	if sets[0].Count != 4 || sets[0].Name != workersPodSet {
		t.Errorf("pod set %s of %d, want %s of 4", sets[0].Name, sets[0].Count, workersPodSet)
	}
	tmpl := sets[0].Template
	if _, ok := tmpl.Labels[trainingv1alpha1.AttemptLabel]; ok {
		t.Error("the template carries the attempt")
	}
	if tmpl.Spec.Affinity != nil && strings.Contains(tmpl.Spec.Affinity.String(), "bad-node") {
		t.Error("the template carries a quarantined node")
	}
	for _, c := range tmpl.Spec.Containers {
		if len(c.Env) > 0 {
			t.Errorf("container %s keeps its environment in the Workload", c.Name)
		}
	}
	if q := tmpl.Spec.Containers[workerpod.WorkerContainer(&tmpl.Spec)].Resources.Requests["amd.com/gpu"]; q.Value() != 8 {
		t.Errorf("the worker requests %s GPUs in the Workload, want 8", q.String())
	}

	// What Kueue admits on does change it.
	bigger := job.DeepCopy()
	bigger.Spec.Nodes = 8
	if podSetsHash(podSets(bigger, "")) == base {
		t.Error("nodes changed and the pod sets did not")
	}
	gpus := job.DeepCopy()
	gpus.Spec.GPUsPerNode = 4
	if podSetsHash(podSets(gpus, "")) == base {
		t.Error("gpusPerNode changed and the pod sets did not")
	}
}

func TestWorkloadCarriesSparesAsASecondPodSet(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(4).Label(kueue.QueueNameLabel, "team").Defaulted().Obj()
	job.Spec.FaultTolerance.Spares = 2
	sets := podSets(job, "")
	if len(sets) != 2 || sets[1].Name != sparesPodSet || sets[1].Count != 2 {
		t.Fatalf("pod sets %+v, want workers and 2 spares", sets)
	}
}

func TestWorkloadNameIsStableBoundedAndPerJob(t *testing.T) {
	job := testjob.MakeZayaTrainingJob(strings.Repeat("a", 250), "ns").Obj()
	job.UID = "u1"
	name := workloadName(job)
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		t.Errorf("%q: %v", name, errs)
	}
	if workloadName(job) != name {
		t.Error("the name is not stable")
	}
	again := job.DeepCopy()
	again.UID = "u2"
	if workloadName(again) == name {
		t.Error("a job recreated under the same name gets the old job's Workload")
	}
	job.Annotations = map[string]string{kueue.PrebuiltWorkloadLabel: "from-multikueue"}
	if workloadName(job) != "from-multikueue" {
		t.Error("MultiKueue's prebuilt Workload is not the job's")
	}
}

func TestTopologyRequestKeepsRingGroupsInASlice(t *testing.T) {
	for _, tc := range []struct {
		name        string
		cp, gpus    int32
		annotations map[string]string
		want        *kueue.TopologyRequest
	}{
		{name: "no request", cp: 16, gpus: 8},
		{name: "required", cp: 1, gpus: 8, annotations: map[string]string{kueue.RequiredTopologyAnnotation: "rack"},
			want: &kueue.TopologyRequest{Required: ptr.To("rack")}},
		{name: "ring over 2 nodes", cp: 16, gpus: 8, annotations: map[string]string{kueue.PreferredTopologyAnnotation: "spine", kueue.SliceRequiredTopologyAnnotation: "rail-block"},
			want: &kueue.TopologyRequest{Preferred: ptr.To("spine"), PodSetSliceRequiredTopology: ptr.To("rail-block"), PodSetSliceSize: ptr.To[int32](2)}},
		{name: "ring in a node", cp: 8, gpus: 8, annotations: map[string]string{kueue.SliceRequiredTopologyAnnotation: "rail-block"},
			want: &kueue.TopologyRequest{PodSetSliceRequiredTopology: ptr.To("rail-block"), PodSetSliceSize: ptr.To[int32](1)}},
		{name: "slice size given", cp: 16, gpus: 8, annotations: map[string]string{kueue.SliceRequiredTopologyAnnotation: "rail-block", kueue.SliceSizeAnnotation: "4"},
			want: &kueue.TopologyRequest{PodSetSliceRequiredTopology: ptr.To("rail-block"), PodSetSliceSize: ptr.To[int32](4)}},
		{name: "bad slice size", cp: 32, gpus: 8, annotations: map[string]string{kueue.SliceRequiredTopologyAnnotation: "rail-block", kueue.SliceSizeAnnotation: "-3"},
			want: &kueue.TopologyRequest{PodSetSliceRequiredTopology: ptr.To("rail-block"), PodSetSliceSize: ptr.To[int32](4)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(8).GPUsPerNode(tc.gpus).ContextParallel(tc.cp).Obj()
			job.Annotations = tc.annotations
			got := topologyRequest(job)
			if tc.want == nil {
				if got != nil {
					t.Fatalf("got %+v, want none", got)
				}
				return
			}
			tc.want.PodIndexLabel = ptr.To(trainingv1alpha1.RankLabel)
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Error(d)
			}
		})
	}
}

func TestPodsReadyConditionFollowsTheGang(t *testing.T) {
	wl := &kueue.Workload{}
	step := func(ready bool, wantStatus metav1.ConditionStatus, wantReason string) {
		t.Helper()
		c := podsReadyCondition(wl, ready)
		if c.Status != wantStatus || c.Reason != wantReason {
			t.Fatalf("ready=%v: %s/%s, want %s/%s", ready, c.Status, c.Reason, wantStatus, wantReason)
		}
		wl.Status.Conditions = []metav1.Condition{c}
	}
	step(false, metav1.ConditionFalse, kueue.ReasonWaitForStart)
	step(true, metav1.ConditionTrue, kueue.ReasonStarted)
	step(true, metav1.ConditionTrue, kueue.ReasonStarted)
	step(false, metav1.ConditionFalse, kueue.ReasonWaitRecovery)
	step(false, metav1.ConditionFalse, kueue.ReasonWaitRecovery)
	step(true, metav1.ConditionTrue, kueue.ReasonRecovered)
	step(false, metav1.ConditionFalse, kueue.ReasonWaitRecovery)
}

func TestPlacementAddsToThePodWithoutOverridingTheTemplate(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Obj()
	job.Spec.Template.Spec.NodeSelector = map[string]string{"pool": "mine"}
	tk := &ticket{job: job, place: map[string]*podPlacement{workersPodSet: {
		nodeSelector: map[string]string{"pool": "flavor", "gpu": "mi300x"},
		tolerations:  []corev1.Toleration{{Key: "reserved", Operator: corev1.TolerationOpExists}},
		// An admission check's pod set updates may not rename the rank or forge its mark.
		labels: map[string]string{kueue.PodSetLabel: workersPodSet, trainingv1alpha1.RankLabel: "0"},
		annotations: map[string]string{kueue.WorkloadAnnotation: "wl", kueue.UnconstrainedTopologyAnnotation: "true",
			trainingv1alpha1.PodMarkAnnotation: "forged"},
		topology: true,
	}}}
	pod := workerpod.Render(job, nil, 1)
	pod.Annotations = map[string]string{trainingv1alpha1.PodMarkAnnotation: "mark"}
	tk.placeOn(pod, workersPodSet)
	tk.placeOn(pod, sparesPodSet) // no admission for it: nothing added
	if pod.Spec.NodeSelector["pool"] != "mine" || pod.Spec.NodeSelector["gpu"] != "mi300x" {
		t.Errorf("node selector %v", pod.Spec.NodeSelector)
	}
	if len(pod.Spec.Tolerations) != 1 {
		t.Errorf("tolerations %v", pod.Spec.Tolerations)
	}
	if pod.Annotations[kueue.UnconstrainedTopologyAnnotation] != "true" || pod.Annotations[kueue.WorkloadAnnotation] != "wl" {
		t.Errorf("annotations %v: Kueue's ungater would not see the pod", pod.Annotations)
	}
	if len(pod.Spec.SchedulingGates) != 1 || pod.Spec.SchedulingGates[0].Name != kueue.TopologyGate {
		t.Errorf("gates %v", pod.Spec.SchedulingGates)
	}
	if pod.Labels[trainingv1alpha1.RankLabel] != "1" || pod.Annotations[trainingv1alpha1.PodMarkAnnotation] != "mark" {
		t.Errorf("the admission overwrote the operator's own keys: %v %v", pod.Labels, pod.Annotations)
	}
}

func TestMergeIntoRefusesAConflict(t *testing.T) {
	dst := map[string]string{"a": "1"}
	if err := mergeInto(dst, map[string]string{"a": "1", "b": "2"}, "x"); err != nil || dst["b"] != "2" {
		t.Errorf("%v %v", err, dst)
	}
	if err := mergeInto(dst, map[string]string{"a": "3"}, "ResourceFlavor f nodeLabels"); err == nil || !strings.Contains(err.Error(), "ResourceFlavor f") {
		t.Errorf("a conflict passed: %v", err)
	}
}

func TestPodGroupNameFitsALabelPerAttemptAndJob(t *testing.T) {
	job := testjob.MakeZayaTrainingJob(strings.Repeat("j", 63), "ns").Obj()
	job.UID = "u1"
	names := map[string]bool{}
	for attempt := range int32(3) {
		n := podGroupName(job, attempt)
		if errs := validation.IsValidLabelValue(n); len(errs) > 0 {
			t.Errorf("%q: %v", n, errs)
		}
		names[n] = true
	}
	other := job.DeepCopy()
	other.UID = "u2"
	names[podGroupName(other, 0)] = true
	if len(names) != 4 {
		t.Errorf("group names collide: %v", names)
	}
}

// Edits a running job may take never make its ranks another shape: the gang would be stopped
// and requeued over an edit of its fault tolerance, say.
func TestRunningEditsKeepTheRanksShape(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(4).Label(kueue.QueueNameLabel, "team").NewCheckpoint("1Gi", "").Defaulted().Obj()
	base := ranksHash(podSets(job, ""))
	edits := map[string]func(j *trainingv1alpha1.ZayaTrainingJob){
		"restartMode Recreate": func(j *trainingv1alpha1.ZayaTrainingJob) {
			j.Spec.FaultTolerance.RestartMode = trainingv1alpha1.RestartModeRecreate
		},
		"inPlaceMechanism Supervisor": func(j *trainingv1alpha1.ZayaTrainingJob) {
			j.Spec.FaultTolerance.InPlaceMechanism = trainingv1alpha1.InPlaceMechanismSupervisor
		},
		"spares":      func(j *trainingv1alpha1.ZayaTrainingJob) { j.Spec.FaultTolerance.Spares = 2 },
		"maxRestarts": func(j *trainingv1alpha1.ZayaTrainingJob) { j.Spec.FaultTolerance.MaxRestarts = ptr.To[int32](1000) },
		"hangTimeout": func(j *trainingv1alpha1.ZayaTrainingJob) {
			j.Spec.FaultTolerance.HangTimeout = &metav1.Duration{Duration: 24 * time.Hour}
		},
		"checkpoint keep":         func(j *trainingv1alpha1.ZayaTrainingJob) { j.Spec.Checkpoint.Keep = 100 },
		"activeDeadlineSeconds":   func(j *trainingv1alpha1.ZayaTrainingJob) { j.Spec.ActiveDeadlineSeconds = ptr.To[int64](60) },
		"ttlSecondsAfterFinished": func(j *trainingv1alpha1.ZayaTrainingJob) { j.Spec.TTLSecondsAfterFinished = ptr.To[int32](1) },
		"successPolicy":           func(j *trainingv1alpha1.ZayaTrainingJob) { j.Spec.SuccessPolicy = trainingv1alpha1.SuccessAllRanks },
		"topology annotation": func(j *trainingv1alpha1.ZayaTrainingJob) {
			j.Annotations = map[string]string{kueue.RequiredTopologyAnnotation: "zaya.dev/rail-block"}
		},
		"labels": func(j *trainingv1alpha1.ZayaTrainingJob) {
			j.Labels["team"], j.Labels[kueue.PriorityClassLabel] = "x", "urgent"
		},
	}
	for name, edit := range edits {
		j := job.DeepCopy()
		edit(j)
		if got := ranksHash(podSets(j, "")); got != base {
			t.Errorf("%s: the ranks changed shape", name)
		}
	}
	gpus := job.DeepCopy()
	gpus.Spec.GPUsPerNode = 4
	if ranksHash(podSets(gpus, "")) == base {
		t.Error("gpusPerNode changed and the ranks did not")
	}
}

// A topology annotation edited on a queued job (no new generation) still marks its Workload
// as made for another spec, so one holding no quota is replaced.
func TestSpecKeyFollowsTheTopologyAnnotations(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(4).Label(kueue.QueueNameLabel, "team").Obj()
	job.Generation = 3
	base := specKey(job)
	same := job.DeepCopy()
	same.Annotations = map[string]string{"unrelated": "x"}
	if specKey(same) != base {
		t.Error("an unrelated annotation changed the key")
	}
	topo := job.DeepCopy()
	topo.Annotations = map[string]string{kueue.RequiredTopologyAnnotation: "zaya.dev/rail-block"}
	if specKey(topo) == base {
		t.Error("a topology annotation did not change the key")
	}
	next := job.DeepCopy()
	next.Generation = 4
	if specKey(next) == base {
		t.Error("a new generation did not change the key")
	}
}

// Ranks under the supervisor carry its init container in the Workload too: Kueue counts its
// requests. It is the operator's, alike in every job, so turning it on or off, or an upgrade
// that starts injecting it, never makes the ranks another shape.
func TestWorkloadPodSetsCarryTheSupervisor(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(4).Label(kueue.QueueNameLabel, "team").
		WorkerCommand([]string{"torchrun", "train.py"}).Defaulted().Obj()
	bare, wrapped := podSets(job, ""), podSets(job, "zaya-worker:dev")
	init := wrapped[0].Template.Spec.InitContainers
	if len(init) == 0 || init[0].Name != trainingv1alpha1.SupervisorInitContainerName || init[0].Resources.Requests.Cpu().IsZero() {
		t.Fatalf("the Workload's ranks have init containers %+v, want the supervisor's with its requests", init)
	}
	if len(bare[0].Template.Spec.InitContainers) != 0 {
		t.Errorf("without a supervisor image the ranks have init containers %+v", bare[0].Template.Spec.InitContainers)
	}
	if podSetsHash(bare) != podSetsHash(wrapped) || ranksHash(bare) != ranksHash(wrapped) {
		t.Error("the supervisor's init container changed the ranks' shape")
	}
	off := job.DeepCopy()
	off.Spec.FaultTolerance.Supervisor = trainingv1alpha1.SupervisorOff
	if sets := podSets(off, "zaya-worker:dev"); len(sets[0].Template.Spec.InitContainers) != 0 {
		t.Errorf("supervisor Off, yet the Workload's ranks have init containers %+v", sets[0].Template.Spec.InitContainers)
	}
}
