package controllers

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/kueue"
)

// Queueing behind Kueue's pod integration: its webhook gives every pod it manages the
// kueue.x-k8s.io/admission scheduling gate and lifts it once it admits the group. A gang whose
// ranks are gated has not started: Queued=True says so, activeDeadlineSeconds does not run out
// in the queue, and a job admitted for the first time starts its clock (startTime, goodput)
// at admission, as a job unsuspended by Kueue does.

// kueueAdmissionGate is the scheduling gate Kueue's pod webhook adds.
const kueueAdmissionGate = "kueue.x-k8s.io/admission"

// admissionGates are the scheduling gates Kueue lifts when it admits a job: not the ones a
// rank waits on for nothing.
var admissionGates = []string{kueueAdmissionGate, kueue.TopologyGate}

// queuedRanks counts the current attempt's pods that Kueue's admission gate holds.
func queuedRanks(job *trainingv1alpha1.ZayaTrainingJob, pods []corev1.Pod) int {
	attempt := strconv.FormatInt(int64(job.Status.Attempt()), 10)
	n := 0
	for i := range pods {
		pod := &pods[i]
		if pod.Labels[trainingv1alpha1.AttemptLabel] == attempt && pod.DeletionTimestamp.IsZero() &&
			slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == kueueAdmissionGate }) {
			n++
		}
	}
	return n
}

// noteQueue sets Queued from the pods and reports whether the gang waits in Kueue's queue.
// The first admission of a job that never ran moves its start to now.
func (p *pass) noteQueue(pods []corev1.Pod) bool {
	st := &p.job.Status
	if n := queuedRanks(p.job, pods); n > 0 {
		p.setCondition(trainingv1alpha1.ConditionQueued, metav1.ConditionTrue, trainingv1alpha1.ReasonWaitingForKueue,
			fmt.Sprintf("%d/%d ranks wait for Kueue to admit them (scheduling gate %s); activeDeadlineSeconds does not run out meanwhile",
				n, p.job.Spec.Nodes, kueueAdmissionGate))
		return true
	}
	c := meta.FindStatusCondition(st.Conditions, trainingv1alpha1.ConditionQueued)
	if c == nil || c.Status != metav1.ConditionTrue {
		return false
	}
	waited := p.now.Sub(c.LastTransitionTime.Time).Round(time.Second)
	p.setCondition(trainingv1alpha1.ConditionQueued, metav1.ConditionFalse, trainingv1alpha1.ReasonAdmitted,
		fmt.Sprintf("Kueue admitted the gang after %s in the queue", waited))
	if st.Restarts == 0 && (st.Goodput == nil || st.Goodput.TrainingSince == nil) {
		// Never ran: the queue was no part of it.
		st.StartTime = &metav1.Time{Time: p.now}
		st.Goodput = nil
	}
	return false
}
