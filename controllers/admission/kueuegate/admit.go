package kueuegate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/admission"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
	"github.com/zaya-operator/zaya-operator/internal/kueue"
)

// workloadFor returns the job's Workload, creating it (or replacing one that no longer
// describes the job and holds no quota) where needed. Nil with no error while there is none
// to run under: one being replaced, MultiKueue's not made yet.
func (t *ticket) workloadFor(ctx context.Context, pods []corev1.Pod) (*kueue.Workload, error) {
	job := t.job
	key := types.NamespacedName{Namespace: job.Namespace, Name: job.Name}
	wl, err := t.ownWorkload(ctx)
	switch {
	case err != nil:
		return nil, err
	case wl == nil:
		// None yet: made under the name the job's labels give now.
		wl = &kueue.Workload{}
		err = t.g.Get(ctx, types.NamespacedName{Namespace: job.Namespace, Name: workloadName(job)}, wl)
	}
	if gone, ok := t.g.gone.Load(key); ok {
		if err == nil && gone == wl.UID {
			return nil, nil // deleted by the operator; the cache has yet to see it go
		}
		t.g.gone.Delete(key)
	}
	switch {
	case apierrors.IsNotFound(err):
		// What the job asks of Kueue is checked when its Workload is made: a later edit
		// never stops a gang that runs under one.
		if err := inputs(job); err != nil {
			return nil, err
		}
		if prebuiltWorkload(job) != "" {
			// Not owned by the job yet, so its arrival wakes nothing: look again.
			return nil, &inputError{msg: fmt.Sprintf("waiting for MultiKueue's Workload %s (annotation %s)", prebuiltWorkload(job), kueue.PrebuiltWorkloadLabel), retry: 5 * time.Second}
		}
		prio, err := t.workloadPriority(ctx)
		if err != nil {
			return nil, err
		}
		wl = newWorkload(job, prio, t.podSets())
		if err := t.g.Create(ctx, wl); err != nil && !apierrors.IsAlreadyExists(err) {
			if refusedForGood(err) {
				// Asked again, the answer would be the same: say why, look again slowly.
				return nil, &inputError{msg: fmt.Sprintf("creating Workload %s: %v", wl.Name, err), retry: time.Minute}
			}
			return nil, fmt.Errorf("creating Workload %s: %w", wl.Name, err)
		}
		t.host.Acted(corev1.EventTypeNormal, trainingv1alpha1.ReasonWaitingForKueue, "Create",
			"created Workload %s in queue %s", wl.Name, wl.Spec.QueueName)
		return wl, nil
	case err != nil:
		return nil, fmt.Errorf("reading Workload: %w", err)
	}
	if !metav1.IsControlledBy(wl, job) {
		if prebuiltWorkload(job) == "" {
			return nil, &admission.NameConflict{Kind: "Workload", Name: wl.Name}
		}
		if err := t.adoptWorkload(ctx, wl); err != nil {
			return nil, err
		}
	}
	if !wl.DeletionTimestamp.IsZero() {
		// Deleted by someone: stop the gang, then let it go; a new one queues the job again.
		return wl, nil
	}
	// Rendered only once the job's spec changed since the Workload was made: not on every
	// pass of a running gang.
	if !fromMultiKueue(wl) && wl.Annotations[jobGenerationAnnotation] != specKey(job) {
		sets := t.podSets()
		// Ranks of another shape (nodes, GPUs, template: edited while suspended, resumed
		// before the old pods were gone) never run under the old admission. Otherwise the
		// job asks for something else (its spares): a Workload holding quota stays until
		// the job stops, the spares capped by it; one holding none is replaced.
		t.reshaped = wl.Annotations[ranksHashAnnotation] != "" && wl.Annotations[ranksHashAnnotation] != ranksHash(sets)
		if t.reshaped || (!holdsQuota(wl) && wl.Annotations[podSetsHashAnnotation] != podSetsHash(sets)) {
			if len(gang.Holding(pods)) > 0 {
				return wl, nil
			}
			t.reshaped = false
			return nil, t.releaseWorkload(ctx, wl, "", "")
		}
	}
	return wl, nil
}

// refusedForGood reports whether the API server refused a write for what it holds (invalid,
// too large, forbidden), not for a passing reason.
func refusedForGood(err error) bool {
	return apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) || apierrors.IsForbidden(err) ||
		apierrors.IsRequestEntityTooLargeError(err) ||
		(apierrors.IsInternalError(err) && strings.Contains(err.Error(), "request is too large"))
}

// ownWorkload is the Workload the job controls, whatever its labels say now: the name is
// fixed when it is made, so a label or annotation edited later (a prebuilt name added, the
// queue label removed) neither takes the job past Kueue nor orphans its admission.
func (t *ticket) ownWorkload(ctx context.Context) (*kueue.Workload, error) {
	if t.ownedChecked {
		return t.owned, nil
	}
	list := &kueue.WorkloadList{}
	if err := t.g.List(ctx, list, client.InNamespace(t.job.Namespace), client.MatchingFields{workerpod.OwnerIndex: t.job.Name}); err != nil {
		return nil, fmt.Errorf("listing Workloads: %w", err)
	}
	name := workloadName(t.job)
	for i := range list.Items {
		wl := &list.Items[i]
		if !metav1.IsControlledBy(wl, t.job) {
			continue
		}
		// One not being deleted first, then the one the labels name.
		if o := t.owned; o == nil || (!o.DeletionTimestamp.IsZero() && wl.DeletionTimestamp.IsZero()) ||
			(o.DeletionTimestamp.IsZero() == wl.DeletionTimestamp.IsZero() && wl.Name == name) {
			t.owned = wl
		}
	}
	t.ownedChecked = true
	return t.owned, nil
}

// holdsQuota reports whether Kueue reserved quota for the Workload.
func holdsQuota(wl *kueue.Workload) bool {
	return wl.Status.Admission != nil || meta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadQuotaReserved)
}

// adoptWorkload makes MultiKueue's prebuilt Workload the job's own. Only one nobody owns, made
// for no other job, and asking for what this job asks for: a tenant naming another
// workload's Workload (a pod group's, say) must not run under its admission.
func (t *ticket) adoptWorkload(ctx context.Context, wl *kueue.Workload) error {
	if len(wl.OwnerReferences) > 0 || (wl.Labels[kueue.JobUIDLabel] != "" && wl.Labels[kueue.JobUIDLabel] != string(t.job.UID)) {
		return &admission.NameConflict{Kind: "Workload", Name: wl.Name}
	}
	live := &kueue.Workload{}
	if err := t.g.reader.Get(ctx, client.ObjectKeyFromObject(wl), live); err != nil {
		return fmt.Errorf("reading Workload %s: %w", wl.Name, err)
	}
	if !samePodSets(live.Spec.PodSets, t.podSets()) {
		return &inputError{msg: fmt.Sprintf("MultiKueue's Workload %s (annotation %s) asks for other pods than the job's: its pod sets differ in names, counts or resources",
			wl.Name, kueue.PrebuiltWorkloadLabel)}
	}
	patch := map[string]any{"metadata": map[string]any{
		"resourceVersion": wl.ResourceVersion,
		"ownerReferences": []metav1.OwnerReference{workerpod.OwnerRef(t.job)},
		"labels":          map[string]string{kueue.JobUIDLabel: string(t.job.UID)},
	}}
	if err := t.g.patchWorkload(ctx, wl, patch, ""); err != nil {
		return err
	}
	wl.OwnerReferences = []metav1.OwnerReference{workerpod.OwnerRef(t.job)}
	return nil
}

// samePodSets reports whether two lists of pod sets ask for the same pods: names, counts and
// each template's summed requests.
func samePodSets(a, b []kueue.PodSet) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || a[i].Count != b[i].Count ||
			!apiequality.Semantic.DeepEqual(podRequests(&a[i].Template.Spec), podRequests(&b[i].Template.Spec)) {
			return false
		}
	}
	return true
}

// podRequests sums a pod's containers' requests.
func podRequests(spec *corev1.PodSpec) corev1.ResourceList {
	out := corev1.ResourceList{}
	for _, c := range spec.Containers {
		for name, q := range c.Resources.Requests {
			sum := out[name]
			sum.Add(q)
			out[name] = sum
		}
	}
	return out
}

// inKueue reports whether the job runs under a Workload of this operator's: it names a queue,
// or it still owns the Workload it was queued with (the label removed from a queued or
// running job does not let it past Kueue).
func (t *ticket) inKueue(ctx context.Context) bool {
	if t.checked {
		return t.managed
	}
	t.checked = true
	switch {
	case !t.g.workloads:
	case t.g.kueueWorkload(t.job):
		t.managed = true
	default:
		wl, err := t.ownWorkload(ctx)
		t.managed = err == nil && wl != nil
	}
	return t.managed
}

// Admit runs the Kueue side of a pass and decides whether the gang may run. One that may not
// (queued, evicted, its Workload going) is held, saying why; once none of its pods holds a
// device, Release hands an evicted Workload's quota back.
func (t *ticket) Admit(ctx context.Context, pods []corev1.Pod) (admission.Verdict, error) {
	if !t.inKueue(ctx) {
		return admission.Verdict{Decision: admission.Run}, nil
	}
	wl, err := t.workloadFor(ctx, pods)
	var conflict *admission.NameConflict
	var input *inputError
	why, retry := "", time.Duration(0)
	switch {
	case errors.As(err, &input):
		why, retry = input.msg, input.retry // held, saying why
	case errors.As(err, &conflict):
		return admission.Verdict{Decision: admission.Hold}, err
	case err != nil:
		// Say why on the job (a priority class that does not exist, say), not only in the log.
		t.host.SetCondition(trainingv1alpha1.ConditionQueued, metav1.ConditionTrue, trainingv1alpha1.ReasonWaitingForKueue,
			"cannot queue the job in Kueue: "+err.Error())
		return admission.Verdict{Decision: admission.Hold}, err
	}
	t.workload = wl
	if wl != nil && wl.DeletionTimestamp.IsZero() && workloadAdmitted(wl) && !t.reshaped {
		place, err := t.placement(ctx, wl)
		var clash *placementConflict
		switch {
		case errors.As(err, &clash):
			t.host.Fail(trainingv1alpha1.ReasonInvalidPodTemplate, "Kueue's admission cannot be applied to the pods: "+err.Error())
			return admission.Verdict{Decision: admission.Refused}, nil
		case err != nil:
			t.placeErr = err // no pod is made until it reads; the gang that runs is still looked after
			place = map[string]*podPlacement{}
		}
		t.place = place
		t.admittedNow()
		return admission.Verdict{Decision: admission.Run}, nil
	}
	t.holdForKueue(pods, wl, why)
	if wl == nil {
		return admission.Verdict{Decision: admission.Hold, Retry: retry}, nil
	}
	// Quota goes back only once no pod holds a device; a pod on a lost node is force-deleted
	// after terminatingTimeout rather than holding it forever.
	return admission.Verdict{Decision: admission.Hold, Holding: true}, nil
}

// Release hands back what the held job's Workload holds, now that none of its pods holds a
// device: an evicted one's quota (Kueue then requeues it), one being deleted let go.
func (t *ticket) Release(ctx context.Context) (time.Duration, error) {
	wl := t.workload
	switch {
	case wl == nil:
		return 0, nil
	case !wl.DeletionTimestamp.IsZero():
	case meta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadEvicted) && holdsQuota(wl):
	default:
		return 0, nil
	}
	// The cache may not have seen pods created moments ago: ask the API server.
	if live, err := t.host.LivePods(ctx); err != nil || live > 0 {
		return time.Second, err
	}
	if !wl.DeletionTimestamp.IsZero() {
		return 0, t.releaseWorkload(ctx, wl, "", "")
	}
	return 0, t.g.unsetQuotaReservation(ctx, wl)
}

// Report tells Kueue how the job is doing (unless the pass failed) and lets go of the pod
// groups it no longer runs.
func (t *ticket) Report(ctx context.Context, pods []corev1.Pod, failed bool) error {
	var err error
	if !failed {
		err = t.syncWorkload(ctx, pods)
	}
	t.releasePodGroups(ctx, pods, t.runningGroup())
	return err
}

// holdForKueue says why the job waits: queued, or stopped by Kueue.
func (t *ticket) holdForKueue(pods []corev1.Pod, wl *kueue.Workload, why string) {
	msg := "waiting for Kueue to admit the job's Workload"
	if why != "" {
		msg = "cannot queue the job in Kueue: " + why
	}
	reason := trainingv1alpha1.ReasonWaitingForKueue
	if wl != nil {
		msg = fmt.Sprintf("waiting for Kueue to admit Workload %s (queue %s)", wl.Name, wl.Spec.QueueName)
		if c := meta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadQuotaReserved); c != nil && c.Status == metav1.ConditionFalse && c.Message != "" {
			msg += ": " + c.Reason + ": " + c.Message
		}
		if c := meta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadEvicted); c != nil && c.Status == metav1.ConditionTrue {
			reason = "Kueue" + c.Reason
			msg = fmt.Sprintf("Kueue evicted Workload %s: %s: %s", wl.Name, c.Reason, c.Message)
		}
		if !wl.DeletionTimestamp.IsZero() {
			msg = fmt.Sprintf("Workload %s is being deleted: the gang stops and the job queues again", wl.Name)
		}
		if t.reshaped {
			msg = fmt.Sprintf("the job's ranks changed while it was suspended: Workload %s admitted the old ones, and is replaced once their pods are gone", wl.Name)
		}
	}
	if len(gang.Active(pods)) > 0 {
		t.host.Normal(reason, "Stop", "%s: stopping the gang", msg)
	}
	t.host.SetCondition(trainingv1alpha1.ConditionQueued, metav1.ConditionTrue, reason, msg)
	t.host.ClearCondition(trainingv1alpha1.ConditionRunning, trainingv1alpha1.ReasonWaitingForKueue, "the job waits for Kueue")
	t.host.ClearCondition(trainingv1alpha1.ConditionRestarting, trainingv1alpha1.ReasonWaitingForKueue, "the job waits for Kueue")
	t.host.ClearCondition(trainingv1alpha1.ConditionWaitingForCapacity, trainingv1alpha1.ReasonWaitingForKueue, "the job waits for Kueue")
}

// admittedNow marks the end of a wait in Kueue's queue. The held job has no start time: its
// clock (activeDeadlineSeconds) starts now.
func (t *ticket) admittedNow() {
	c := meta.FindStatusCondition(t.job.Status.Conditions, trainingv1alpha1.ConditionQueued)
	if c == nil || c.Status != metav1.ConditionTrue {
		return
	}
	waited := t.host.Now().Sub(c.LastTransitionTime.Time).Round(1e9)
	t.host.SetCondition(trainingv1alpha1.ConditionQueued, metav1.ConditionFalse, trainingv1alpha1.ReasonAdmitted,
		fmt.Sprintf("Kueue admitted Workload %s to ClusterQueue %s after %s", t.workload.Name, t.workload.Status.Admission.ClusterQueue, waited))
}

// syncWorkload tells Kueue how the job is doing: PodsReady while it runs, Finished once it
// ended (then Kueue's finalizer goes: the quota is free).
func (t *ticket) syncWorkload(ctx context.Context, pods []corev1.Pod) error {
	if err := t.loadWorkload(ctx); err != nil {
		return err
	}
	wl := t.workload
	if wl == nil || !wl.DeletionTimestamp.IsZero() {
		return nil
	}
	job := t.job
	var conds []metav1.Condition
	if ended(job) {
		reason, c := kueue.ReasonSucceeded, meta.FindStatusCondition(job.Status.Conditions, trainingv1alpha1.ConditionSucceeded)
		if c == nil || c.Status != metav1.ConditionTrue {
			reason, c = kueue.ReasonFailed, meta.FindStatusCondition(job.Status.Conditions, trainingv1alpha1.ConditionFailed)
		}
		if !meta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadFinished) {
			conds = append(conds, metav1.Condition{Type: kueue.WorkloadFinished, Status: metav1.ConditionTrue, Reason: reason, Message: c.Message})
		}
	} else if wl.Status.Admission != nil {
		conds = append(conds, podsReadyCondition(wl, workloadAdmitted(wl) && job.Status.ReadyNodes >= job.Width() &&
			meta.IsStatusConditionTrue(job.Status.Conditions, trainingv1alpha1.ConditionRunning)))
	}
	if err := t.g.setWorkloadConditions(ctx, wl, conds...); err != nil {
		return err
	}
	if ended(job) && len(gang.Holding(pods)) == 0 {
		return t.g.dropFinalizer(ctx, wl)
	}
	return nil
}

// ended reports whether the job succeeded or failed: Kueue's Workload is then Finished.
func ended(job *trainingv1alpha1.ZayaTrainingJob) bool {
	return meta.IsStatusConditionTrue(job.Status.Conditions, trainingv1alpha1.ConditionSucceeded) ||
		meta.IsStatusConditionTrue(job.Status.Conditions, trainingv1alpha1.ConditionFailed)
}

// podsReadyCondition is Kueue's PodsReady for the gang: Started the first time every rank is
// ready, WaitForRecovery while a restart brings it back, Recovered when it is back.
func podsReadyCondition(wl *kueue.Workload, ready bool) metav1.Condition {
	old := meta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadPodsReady)
	c := metav1.Condition{Type: kueue.WorkloadPodsReady, Status: metav1.ConditionFalse, Reason: kueue.ReasonWaitForStart,
		Message: "not all ranks are ready"}
	switch {
	case ready && old != nil && old.Reason == kueue.ReasonWaitRecovery:
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, kueue.ReasonRecovered, "every rank is ready again"
	case ready && old != nil && old.Status == metav1.ConditionTrue:
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, old.Reason, old.Message
	case ready:
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, kueue.ReasonStarted, "every rank is ready"
	case old != nil && (old.Status == metav1.ConditionTrue || old.Reason == kueue.ReasonWaitRecovery):
		c.Reason, c.Message = kueue.ReasonWaitRecovery, "the gang restarts: not all ranks are ready"
	}
	return c
}

// Suspended lets a suspended job's Workload go once none of its pods holds a device: a
// suspended job holds no quota. Resuming queues it again with a new Workload.
func (t *ticket) Suspended(ctx context.Context, pods []corev1.Pod) error {
	if !t.inKueue(ctx) || len(gang.Holding(pods)) > 0 {
		return nil
	}
	wl, err := t.ownWorkload(ctx)
	if err != nil || wl == nil || fromMultiKueue(wl) {
		return err // MultiKueue's prebuilt one is its manager's to end
	}
	return t.releaseWorkload(ctx, wl, "", "")
}

// loadWorkload reads the job's own Workload for a pass that did not (a finished job's).
func (t *ticket) loadWorkload(ctx context.Context) error {
	if t.workload != nil || !t.inKueue(ctx) {
		return nil
	}
	wl, err := t.ownWorkload(ctx)
	t.workload = wl
	return err
}
