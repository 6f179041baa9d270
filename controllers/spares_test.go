package controllers

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
	"github.com/zaya-operator/zaya-operator/controllers/restart"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

func withSpares(n int32) func(*trainingv1alpha1.ZayaTrainingJob) {
	return func(j *trainingv1alpha1.ZayaTrainingJob) { j.Spec.FaultTolerance.Spares = n }
}

func spareNames(h *harness, t *testing.T) []string {
	var out []string
	for name := range h.pods(t) {
		if strings.Contains(name, "-spare-") {
			out = append(out, name)
		}
	}
	slicesSort(out)
	return out
}

func TestWarmSparesHoldANodeLikeARank(t *testing.T) {
	h, job := inPlaceGang(t, withSpares(2))
	if got := spareNames(h, t); len(got) != 2 || got[0] != "llm-spare-0" || got[1] != "llm-spare-1" {
		t.Fatalf("spares %v, want llm-spare-0 and llm-spare-1 once the gang is placed", got)
	}
	s := h.pods(t)["llm-spare-1"]
	c := s.Spec.Containers
	if len(c) != 1 || c[0].Image != recovery.DefaultSpareImage || !c[0].Resources.Limits["amd.com/gpu"].Equal(resource.MustParse("8")) ||
		s.Labels[trainingv1alpha1.RankLabel] != "" || s.Labels[trainingv1alpha1.SpareLabel] != "1" || s.Labels[trainingv1alpha1.JobNameLabel] != "llm" ||
		s.Spec.AutomountServiceAccountToken == nil || *s.Spec.AutomountServiceAccountToken || s.Spec.RestartPolicy != corev1.RestartPolicyAlways ||
		s.Spec.SecurityContext == nil || s.Spec.SecurityContext.RunAsNonRoot == nil || !*s.Spec.SecurityContext.RunAsNonRoot {
		t.Errorf("spare %+v: want one pause container holding a rank's 8 GPUs, labelled as the job's spare 1, no token, restricted", s)
	}
	if s.Annotations[trainingv1alpha1.PodMarkAnnotation] == "" {
		t.Error("the spare is not marked as the operator's")
	}
	h.runAll(t)
	h.mustReconcile(t, job)
	if got := h.get(t, job).Status.ReadySpares; got != 2 {
		t.Errorf("readySpares %d, want 2", got)
	}
	// Spares are no ranks: nothing takes them for stale pods of another attempt.
	h.expectQuiet(t, job, 2)
}

func TestAReplacedRankTakesAWarmSparesNodeAndTheSpareIsReplenished(t *testing.T) {
	h, job := inPlaceGang(t, withSpares(1))
	h.runAll(t) // the spare runs on node-llm-spare-0
	h.mustReconcile(t, job)
	h.drainEvents()

	h.setNode(t, "node-llm-0-1", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionUnknown })
	h.mustReconcile(t, job)
	st := h.get(t, job).Status
	if len(st.Replacing) != 1 || st.Replacing[0].Rank != 1 || st.Replacing[0].SpareNode != "node-llm-spare-0" || st.SparesTaken != 1 {
		t.Fatalf("replacing %+v, sparesTaken %d: want rank 1 onto node-llm-spare-0", st.Replacing, st.SparesTaken)
	}
	if ev := h.drainEvents(); !containsPrefix(ev, "Warning ReplacingPods replacing rank 1 (pod llm-0-1 on node-llm-0-1) onto the warm spare's node node-llm-spare-0") {
		t.Errorf("events = %q", ev)
	}
	h.mustReconcile(t, job) // deletes rank 1's pod and the spare
	if got := spareNames(h, t); len(got) != 0 {
		t.Fatalf("spares %v left after the takeover", got)
	}
	h.mustReconcile(t, job) // the rank's new pod, bound to the spare's node
	pod := h.pods(t)["llm-0-1"]
	terms := pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	for _, term := range terms {
		if !strings.Contains(term.String(), "Operator:In,Values:[node-llm-spare-0]") || !strings.Contains(term.String(), "Operator:NotIn,Values:[node-llm-0-1]") {
			t.Errorf("term %s: want the spare's node, and off the lost one", term.String())
		}
	}
	if len(terms) == 0 {
		t.Error("the new pod is not kept to the spare's node")
	}
	if got := spareNames(h, t); len(got) != 0 {
		t.Errorf("spares %v made while a rank waits for its node", got)
	}

	// The rank starts on the spare's node, its peers restart in place: a spare is made again,
	// off the quarantined node.
	back := now.Add(2 * time.Second)
	h.r.Clock = clockAt(back)
	h.setPod(t, "llm-0-0", restartedInPlace("node-llm-0-0", 1, trainingv1alpha1.ExitStopped, now.Add(time.Second), back))
	h.setPod(t, "llm-0-2", restartedInPlace("node-llm-0-2", 1, trainingv1alpha1.ExitStopped, now.Add(time.Second), back))
	h.setPod(t, "llm-0-1", runningSince("node-llm-spare-0", back))
	h.mustReconcile(t, job)
	h.mustReconcile(t, job)
	got := h.get(t, job)
	if c := condition(got, "Restarting"); c.Reason != trainingv1alpha1.ReasonRecovered {
		t.Errorf("Restarting = %+v, want Recovered", c)
	}
	spare := h.pods(t)["llm-spare-0"]
	if spare == nil {
		t.Fatal("the taken spare was not replenished")
	}
	if a := spare.Spec.Affinity; a == nil || !strings.Contains(a.NodeAffinity.String(), "NotIn,Values:[node-llm-0-1]") {
		t.Errorf("the new spare's affinity %+v does not keep it off the quarantined node", a)
	}
}

func TestSparesGiveWayToTheGang(t *testing.T) {
	h, job := inPlaceGang(t, withSpares(2))
	// A rank waits for room (its pod was lost and cannot be placed again): no spare is held.
	h.setPod(t, "llm-0-2", unschedulable("0/3 nodes are available: 3 Insufficient amd.com/gpu"))
	h.mustReconcile(t, job)
	if got := spareNames(h, t); len(got) != 0 {
		t.Errorf("spares %v held while a rank waits for room", got)
	}

	// Recreate mode replaces no rank alone: it holds none.
	h2, job2 := inPlaceGang(t, withSpares(2), func(j *trainingv1alpha1.ZayaTrainingJob) {
		j.Spec.FaultTolerance.RestartMode = trainingv1alpha1.RestartModeRecreate
	})
	h2.mustReconcile(t, job2)
	if got := spareNames(h2, t); len(got) != 0 {
		t.Errorf("spares %v under restartMode Recreate", got)
	}
}

func TestAFinishedJobKeepsNoSpare(t *testing.T) {
	h, job := inPlaceGang(t, withSpares(1))
	h.runAll(t)
	for r := range 3 {
		h.setPod(t, workerpod.PodName(job, 0, int32(r)), exited(workerpod.PodName(job, 0, int32(r)), 0, now))
	}
	for range 3 {
		h.mustReconcile(t, job)
	}
	if c := condition(h.get(t, job), "Succeeded"); c == nil || c.Status != "True" {
		t.Fatalf("Succeeded = %+v", c)
	}
	if got := spareNames(h, t); len(got) != 0 {
		t.Errorf("spares %v outlive the job's success", got)
	}
}

// Spares are good neighbours: no template priority (an idle spare must preempt nobody), the
// template's runtime class (where the rank it stands in for can run), and no peer in the
// rendezvous Service.
func TestASpareNeverPreemptsAndRunsWhereItsRankCould(t *testing.T) {
	h, job := inPlaceGang(t, withSpares(1), func(j *trainingv1alpha1.ZayaTrainingJob) {
		j.Spec.Template.Spec.PriorityClassName = "team-critical"
		j.Spec.Template.Spec.RuntimeClassName = ptr.To("rocm")
	})
	s := h.pods(t)["llm-spare-0"]
	if s == nil {
		t.Fatal("no spare")
	}
	if s.Spec.PriorityClassName != "" || s.Spec.RuntimeClassName == nil || *s.Spec.RuntimeClassName != "rocm" {
		t.Errorf("spare priority class %q, runtime class %v: want none, and the template's rocm", s.Spec.PriorityClassName, s.Spec.RuntimeClassName)
	}
	svc := workerpod.Service(h.get(t, job))
	sel := labels.SelectorFromSet(svc.Spec.Selector)
	if sel.Matches(labels.Set(s.Labels)) || !sel.Matches(labels.Set(h.pods(t)["llm-0-1"].Labels)) {
		t.Errorf("the rendezvous Service (selector %v) selects the spare, or misses rank 1", svc.Spec.Selector)
	}
	h.r.SparePriorityClass = "zaya-spare"
	if got := newSparePod(h.get(t, job), 0, recovery.DefaultSpareImage, h.r.SparePriorityClass); got.Spec.PriorityClassName != "zaya-spare" {
		t.Errorf("spare priority class %q, want the platform's zaya-spare", got.Spec.PriorityClassName)
	}
}

// A spare whose node another job quarantined with a taint, or whose GPUs went unhealthy, since
// it came up is not taken: the rank would land where everyone else keeps off.
func TestASpareOnANodeGoneBadIsNotTaken(t *testing.T) {
	for name, spoil := range map[string]func(*corev1.Node){
		"tainted by another job": func(n *corev1.Node) {
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: trainingv1alpha1.QuarantineTaintKey, Value: "other.job", Effect: corev1.TaintEffectNoSchedule})
		},
		"an unhealthy GPU": func(n *corev1.Node) { n.Status.Allocatable["amd.com/gpu"] = resource.MustParse("7") },
	} {
		t.Run(name, func(t *testing.T) {
			h, job := inPlaceGang(t, withSpares(1))
			h.runAll(t)
			h.mustReconcile(t, job)
			h.setNode(t, "node-llm-spare-0", spoil)
			h.setNode(t, "node-llm-0-1", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionUnknown })
			h.mustReconcile(t, job)
			st := h.get(t, job).Status
			if len(st.Replacing) != 1 || st.Replacing[0].SpareNode != "" || st.SparesTaken != 0 {
				t.Errorf("replacing %+v, sparesTaken %d: want rank 1 replaced without the spare", st.Replacing, st.SparesTaken)
			}
		})
	}
}

// A spare the kubelet refused is made again no sooner than restart.SpareRetry after it was made, not
// on every pass.
func TestARefusedSpareIsRetriedAfterABackoff(t *testing.T) {
	h, job := inPlaceGang(t, withSpares(1))
	first := h.pods(t)["llm-spare-0"]
	if first == nil {
		t.Fatal("no spare")
	}
	h.setPod(t, "llm-spare-0", func(p *corev1.Pod) {
		p.Spec.NodeName = "node-x"
		p.Status.Phase, p.Status.Reason = corev1.PodFailed, "OutOfamd.com/gpu"
		p.CreationTimestamp = metav1.NewTime(now)
	})
	res := h.mustReconcile(t, job)
	if got := h.pods(t)["llm-spare-0"]; got == nil || got.UID != first.UID {
		t.Fatalf("the refused spare was replaced at once")
	}
	if res.RequeueAfter <= 0 || res.RequeueAfter > restart.SpareRetry {
		t.Errorf("requeue after %v, want within %v", res.RequeueAfter, restart.SpareRetry)
	}
	h.r.Clock.(interface{ SetTime(time.Time) }).SetTime(now.Add(restart.SpareRetry))
	h.mustReconcile(t, job)
	h.mustReconcile(t, job)
	if got := h.pods(t)["llm-spare-0"]; got != nil && got.UID == first.UID {
		t.Errorf("the refused spare was not made again after %v", restart.SpareRetry)
	}
}

// A replacement onto a spare's node is kept to that node; a spare is not, even one modelled on
// the rank replaced: with rank 0 replaced onto a spare's node, every new spare was kept to
// that node, beside rank 0, and never scheduled (found when rank 0's node froze).
func TestASpareIsNotKeptToTheNodeItsModelRankTakes(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Defaulted().Obj()
	job.Spec.FaultTolerance.Spares = 1
	job.Status.Replacing = []trainingv1alpha1.ReplacedPod{{Rank: 0, UID: "u0", Reason: string(trainingv1alpha1.FailureReasonNodeLost), SpareNode: "node-s"}}
	keptTo := func(p *corev1.Pod) []string {
		var out []string
		if a := p.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
			for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
				for _, f := range term.MatchFields {
					if f.Operator == corev1.NodeSelectorOpIn {
						out = append(out, f.Values...)
					}
				}
			}
		}
		return out
	}
	if got := keptTo(newWorkerPod(job, nil, 0)); len(got) != 1 || got[0] != "node-s" {
		t.Fatalf("rank 0's replacement is kept to %v, want the spare's node-s", got)
	}
	if got := keptTo(newSparePod(job, 0, recovery.DefaultSpareImage, "")); len(got) != 0 {
		t.Errorf("a new spare is kept to %v, want no node", got)
	}
}
