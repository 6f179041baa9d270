package controllers

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// podOwnerKey indexes pods by the name of the ZayaTrainingJob that controls them.
const podOwnerKey = ".metadata.controller.zayatrainingjob"

func indexPodOwner(o client.Object) []string {
	ref := metav1.GetControllerOf(o)
	if ref == nil || ref.Kind != "ZayaTrainingJob" || ref.APIVersion != trainingv1alpha1.GroupVersion.String() {
		return nil
	}
	return []string{ref.Name}
}

// CacheOptions makes the manager cache only the pods, services and claims this operator
// labels, so its memory grows with its own jobs, not with the cluster.
func CacheOptions() cache.Options {
	req, err := labels.NewRequirement(trainingv1alpha1.JobNameLabel, selection.Exists, nil)
	if err != nil {
		panic(err) // a constant requirement cannot fail
	}
	ours := cache.ByObject{Label: labels.NewSelector().Add(*req)}
	return cache.Options{
		// Nothing here reads managedFields, a large share of every object; updates leave
		// them as they are when the request omits them.
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}:                   {Label: ours.Label, Transform: slimPod},
			&corev1.Service{}:               ours, // metadata only: see metadataOf
			&corev1.PersistentVolumeClaim{}: ours, // metadata only, likewise
			// Nodes are watched for health only: drop what is big and unused.
			&corev1.Node{}: {Transform: slimNode},
		},
	}
}

// slimPod keeps what the reconciler reads of its pods: metadata, status, the node, the grace
// period and the containers' names. The rest of the spec (the RCCL environment, probes,
// volumes, affinity) is most of a worker pod and is never read back: the operator creates and
// deletes pods but never updates one, so nothing dropped here can be written back.
func slimPod(o any) (any, error) {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return o, nil
	}
	p.ManagedFields = nil
	containers := make([]corev1.Container, len(p.Spec.Containers))
	for i, c := range p.Spec.Containers {
		containers[i] = corev1.Container{Name: c.Name}
	}
	p.Spec = corev1.PodSpec{NodeName: p.Spec.NodeName, TerminationGracePeriodSeconds: p.Spec.TerminationGracePeriodSeconds,
		Containers: containers}
	return p, nil
}

// slimNode keeps what nodeProblem and tainting need.
func slimNode(o any) (any, error) {
	if n, ok := o.(*corev1.Node); ok {
		n.ManagedFields = nil
		n.Status.Images = nil
		n.Status.VolumesAttached = nil
		n.Status.VolumesInUse = nil
	}
	return o, nil
}

// gang is the state of a job's pods for its current attempt.
type gang struct {
	ranks     []*corev1.Pod // live pods of the current attempt, by rank; nil where missing
	disrupted []*corev1.Pod // current-attempt pods deleted under the running gang
	stale     []*corev1.Pod // live pods of other attempts or out-of-range ranks
	draining  []*corev1.Pod // pods of other attempts still terminating

	ready, scheduled, succeeded, unschedulable int32
	unschedulableMessage                       string
	unschedulableSince                         time.Time // earliest verdict still standing
	checkpointStep                             int64     // newest step in a termination message, -1 if none
	firstFailed                                *corev1.Pod
}

// classify sorts the job's pods into the gang of its current attempt.
func classify(job *trainingv1alpha1.ZayaTrainingJob, pods []corev1.Pod) gang {
	n := job.Spec.Nodes
	g := gang{ranks: make([]*corev1.Pod, n), checkpointStep: -1}
	attempt := strconv.FormatInt(int64(job.Status.Restarts), 10)
	previous := strconv.FormatInt(int64(job.Status.Restarts-1), 10)
	for i := range pods {
		pod := &pods[i]
		rank, err := strconv.ParseInt(pod.Labels[trainingv1alpha1.RankLabel], 10, 32)
		current := err == nil && rank >= 0 && int32(rank) < n && pod.Labels[trainingv1alpha1.AttemptLabel] == attempt
		terminal := pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded
		switch {
		case !current && terminal && pod.DeletionTimestamp.IsZero() && pod.Labels[trainingv1alpha1.AttemptLabel] == previous:
			// The previous attempt's finished pods stay for `kubectl logs`; they hold no devices.
			continue
		case !current && pod.DeletionTimestamp.IsZero():
			g.stale = append(g.stale, pod)
			continue
		case !current:
			g.draining = append(g.draining, pod)
			continue
		case !pod.DeletionTimestamp.IsZero() && pod.Status.Phase != corev1.PodFailed && pod.Status.Phase != corev1.PodSucceeded:
			g.disrupted = append(g.disrupted, pod)
			continue
		}
		g.ranks[rank] = pod
		if step, ok := reportedCheckpoint(pod); ok && step > g.checkpointStep {
			g.checkpointStep = step
		}
		if pod.Spec.NodeName != "" {
			g.scheduled++
		}
		switch pod.Status.Phase {
		case corev1.PodSucceeded:
			g.succeeded++
		case corev1.PodFailed:
			if g.firstFailed == nil || finishedAt(pod).Before(finishedAt(g.firstFailed)) {
				g.firstFailed = pod
			}
		case corev1.PodRunning:
			if podReady(pod) {
				g.ready++
			}
		case corev1.PodPending:
			if c := podCondition(pod, corev1.PodScheduled); c != nil && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				if g.unschedulable == 0 {
					g.unschedulableMessage = fmt.Sprintf("rank %d: %s", rank, c.Message)
				}
				if g.unschedulable == 0 || c.LastTransitionTime.Time.Before(g.unschedulableSince) {
					g.unschedulableSince = c.LastTransitionTime.Time
				}
				g.unschedulable++
			}
		}
	}
	return g
}

// missing are the ranks that need a pod.
func (g gang) missing() []int32 {
	var out []int32
	for r, p := range g.ranks {
		if p == nil {
			out = append(out, int32(r))
		}
	}
	return out
}

// firstFailure is the pod of the current attempt that failed first: the root cause, as its
// peers fail later in collective timeouts. Nil when nothing failed.
func (g gang) firstFailure() *corev1.Pod {
	first := g.firstFailed
	for _, p := range g.disrupted {
		if first == nil || p.DeletionTimestamp.Time.Before(failedAt(first)) {
			first = p
		}
	}
	return first
}

// failedAt is when a pod failed or was deleted.
func failedAt(pod *corev1.Pod) time.Time {
	if !pod.DeletionTimestamp.IsZero() && pod.Status.Phase != corev1.PodFailed {
		return pod.DeletionTimestamp.Time
	}
	return finishedAt(pod)
}

func podCondition(pod *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == t {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

func podReady(pod *corev1.Pod) bool {
	c := podCondition(pod, corev1.PodReady)
	return c != nil && c.Status == corev1.ConditionTrue
}

// workerStatus is the status of a pod's worker container, if it has one yet.
func workerStatus(pod *corev1.Pod) *corev1.ContainerStatus {
	name := pod.Spec.Containers[workerContainer(&pod.Spec)].Name
	for i := range pod.Status.ContainerStatuses {
		if pod.Status.ContainerStatuses[i].Name == name {
			return &pod.Status.ContainerStatuses[i]
		}
	}
	return nil
}

// reportedCheckpoint reads the last committed checkpoint step a stopped worker wrote to its
// termination message ("checkpoint-step=N" on a line of its own).
func reportedCheckpoint(pod *corev1.Pod) (int64, bool) {
	s := workerStatus(pod)
	if s == nil || s.State.Terminated == nil {
		return 0, false
	}
	for line := range strings.Lines(s.State.Terminated.Message) {
		v, found := strings.CutPrefix(strings.TrimSpace(line), trainingv1alpha1.TerminationMessageCheckpointPrefix)
		if !found {
			continue
		}
		if step, err := strconv.ParseInt(v, 10, 64); err == nil && step >= 0 {
			return step, true
		}
	}
	return 0, false
}

// finishedAt is when a failed pod's worker stopped, for finding the rank that failed first
// (its peers fail later, in collective timeouts).
func finishedAt(pod *corev1.Pod) time.Time {
	if s := workerStatus(pod); s != nil && s.State.Terminated != nil {
		return s.State.Terminated.FinishedAt.Time
	}
	return time.Time{}
}

// failureOf describes a failed pod.
func failureOf(pod *corev1.Pod, now time.Time, attempt int32) trainingv1alpha1.JobFailure {
	rank, _ := strconv.ParseInt(pod.Labels[trainingv1alpha1.RankLabel], 10, 32)
	f := trainingv1alpha1.JobFailure{
		Time: metav1.Time{Time: now}, Attempt: attempt, Node: pod.Spec.NodeName,
		Rank: ptr.To(int32(rank)), Reason: trainingv1alpha1.FailureReasonExitCode,
	}
	what := "failed"
	if pod.Status.Reason != "" {
		f.Reason = podFailureReason(pod.Status.Reason)
		what = pod.Status.Reason
	}
	if s := workerStatus(pod); s != nil && s.State.Terminated != nil {
		t := s.State.Terminated
		f.ExitCode = ptr.To(t.ExitCode)
		what = fmt.Sprintf("exited %d (%s)", t.ExitCode, t.Reason)
		if msg := strings.TrimSpace(t.Message); msg != "" {
			what += ": " + msg
		}
	} else if pod.Status.Message != "" {
		what += ": " + pod.Status.Message
	}
	node := pod.Spec.NodeName
	if node == "" {
		node = "no node"
	}
	f.Message = truncate(fmt.Sprintf("rank %d (pod %s on %s) %s", rank, pod.Name, node, what))
	return f
}

// conditionReason is the pattern the API enforces on a condition's reason.
var conditionReason = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)

// podFailureReason turns a failed pod's status reason into a failure reason. Kubelet
// admission reasons such as OutOfamd.com/gpu are not valid condition reasons (a status
// write carrying one would be refused on every pass) and are unbounded as metric labels.
func podFailureReason(r string) string {
	if strings.HasPrefix(r, "OutOf") || r == "UnexpectedAdmissionError" || r == "NodeAffinity" ||
		len(r) > 64 || !conditionReason.MatchString(r) {
		return trainingv1alpha1.FailureReasonNodeRejected
	}
	return r
}

// activePods are the pods that still run or wait to run.
func activePods(pods []corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for i := range pods {
		p := &pods[i]
		if p.DeletionTimestamp.IsZero() && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			out = append(out, p)
		}
	}
	return out
}

// expectationTTL is how long a created pod that the cache has not shown yet is trusted to
// exist; after it the rank counts as missing again (the pod may have been deleted before any
// pass saw it). Watches lag by milliseconds, and by over 10 s in a 2048-pod launch on 2 cores.
const expectationTTL = 30 * time.Second

// creations remembers the pods this process created that its cache has not shown yet, so a
// pass that runs before the watch catches up does not create them again: at 2048 ranks that
// was over a thousand AlreadyExists round trips per launch.
type creations struct {
	mu   sync.Mutex
	jobs map[types.NamespacedName]*jobCreations
}

type jobCreations struct {
	uid   types.UID            // a re-created job of the same name starts afresh
	names map[string]time.Time // pod name → created at
}

func (c *creations) of(job *trainingv1alpha1.ZayaTrainingJob) *jobCreations {
	key := types.NamespacedName{Namespace: job.Namespace, Name: job.Name}
	if c.jobs == nil {
		c.jobs = map[types.NamespacedName]*jobCreations{}
	}
	jc := c.jobs[key]
	if jc == nil || jc.uid != job.UID {
		jc = &jobCreations{uid: job.UID, names: map[string]time.Time{}}
		c.jobs[key] = jc
	}
	return jc
}

// pending returns, of the missing ranks, those to create now, and when the earliest
// held-back one expires (0 if none is held back). Pods the cache shows, and expectations
// past their TTL, are forgotten.
func (c *creations) pending(job *trainingv1alpha1.ZayaTrainingJob, g gang, missing []int32, now time.Time) ([]int32, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := c.of(job).names
	if len(seen) == 0 {
		return missing, 0
	}
	for _, pod := range g.ranks {
		if pod != nil {
			delete(seen, pod.Name)
		}
	}
	for name, at := range seen {
		if now.Sub(at) >= expectationTTL {
			delete(seen, name)
		}
	}
	var out []int32
	var next time.Duration
	for _, r := range missing {
		at, ok := seen[podName(job, job.Status.Restarts, r)]
		if !ok {
			out = append(out, r)
			continue
		}
		if left := expectationTTL - now.Sub(at); next == 0 || left < next {
			next = left
		}
	}
	return out, next
}

func (c *creations) created(job *trainingv1alpha1.ZayaTrainingJob, name string, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.of(job).names[name] = at
}

// forget drops a deleted job's expectations.
func (c *creations) forget(key types.NamespacedName) {
	c.mu.Lock()
	delete(c.jobs, key)
	c.mu.Unlock()
}

// createMissing creates the pods of every missing rank concurrently. A pod the apiserver
// refuses as invalid fails the job: retrying cannot fix the template. It returns when to look
// again for ranks whose fresh pods the cache has not shown yet.
func (p *pass) createMissing(ctx context.Context, g gang) (time.Duration, error) {
	ranks, recheck := p.r.creations.pending(p.job, g, g.missing(), p.now)
	if len(ranks) == 0 {
		return recheck, nil
	}
	network := networkEnv(&p.job.Spec)
	var created atomic.Int32
	var mu sync.Mutex
	var invalid error
	eg, ctx := errgroup.WithContext(ctx)
	eg.SetLimit(p.r.createParallelism())
	for _, rank := range ranks {
		eg.Go(func() error {
			pod := newWorkerPod(p.job, network, rank)
			err := p.r.Create(ctx, pod)
			switch {
			case err == nil:
				created.Add(1)
				podsCreated.Inc()
				g.ranks[rank] = pod
				p.r.creations.created(p.job, pod.Name, p.r.Clock.Now()) // not p.now: a big pass takes seconds
			case apierrors.IsAlreadyExists(err):
				p.r.creations.created(p.job, pod.Name, p.r.Clock.Now())
			case apierrors.IsInvalid(err):
				mu.Lock()
				invalid = err
				mu.Unlock()
			default:
				return fmt.Errorf("creating pod %s: %w", pod.Name, err)
			}
			return nil
		})
	}
	err := eg.Wait()
	if n := created.Load(); n > 0 {
		p.normal(trainingv1alpha1.ReasonPodsCreated, "Create", "created %d worker pods for attempt %d", n, p.job.Status.Restarts)
		log.FromContext(ctx).V(1).Info("created worker pods", "count", n, "attempt", p.job.Status.Restarts)
	}
	if invalid != nil {
		p.fail(trainingv1alpha1.ReasonInvalidPodTemplate, "the apiserver refused the worker pod: "+invalid.Error())
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		// Admission refusals (Pod Security, quota, webhooks) say what to change: show them
		// where users look, not only in the operator's log.
		p.warning(trainingv1alpha1.ReasonFailedCreate, "Create", "%v (retrying)", err)
	}
	return recheck, err
}

func (r *ZayaTrainingJobReconciler) createParallelism() int {
	if r.CreateParallelism > 0 {
		return r.CreateParallelism
	}
	return defaultCreateParallelism
}

// restartGracePeriod caps how long the pods of a failed gang may take to stop.
const restartGracePeriod = 10 * time.Second

// deletePods deletes pods concurrently; ones already gone are fine.
// With brief, each pod gets at most restartGracePeriod to stop: a broken gang's workers are
// stuck in collectives and cannot checkpoint anyway; otherwise (suspend) the pod's own grace
// period lets healthy workers save on SIGTERM.
func (p *pass) deletePods(ctx context.Context, pods []*corev1.Pod, brief bool) error {
	if len(pods) == 0 {
		return nil
	}
	eg, ctx := errgroup.WithContext(ctx)
	eg.SetLimit(p.r.createParallelism())
	for _, pod := range pods {
		eg.Go(func() error {
			opts := []client.DeleteOption{client.Preconditions{UID: &pod.UID}}
			if brief {
				grace := int64(restartGracePeriod.Seconds())
				if g := pod.Spec.TerminationGracePeriodSeconds; g != nil && *g < grace {
					grace = *g
				}
				opts = append(opts, client.GracePeriodSeconds(grace))
			}
			err := p.r.Delete(ctx, pod, opts...)
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return fmt.Errorf("deleting pod %s: %w", pod.Name, err)
			}
			return nil
		})
	}
	return eg.Wait()
}

// formatEnv renders variables as NAME=value pairs for events.
func formatEnv(env []corev1.EnvVar) string {
	parts := make([]string, 0, len(env))
	for _, e := range env {
		v := e.Value
		if e.ValueFrom != nil {
			v = "<from a reference>"
		}
		parts = append(parts, e.Name+"="+v)
	}
	slices.Sort(parts)
	return "network environment: " + strings.Join(parts, " ")
}
