package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/zaya-operator/zaya-operator/api/contract"
	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/admission"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
)

// defaultCreateParallelism bounds concurrent pod creations and deletions of one job.
const defaultCreateParallelism = 128

func (r *ZayaTrainingJobReconciler) createParallelism() int {
	if r.CreateParallelism > 0 {
		return r.CreateParallelism
	}
	return defaultCreateParallelism
}

// createMissing creates the pods of every missing rank concurrently. A pod the apiserver
// refuses as invalid fails the job: retrying cannot fix the template. It returns when to look
// again for ranks whose fresh pods the cache has not shown yet.
func (p *pass) createMissing(ctx context.Context, g gang.Gang) (time.Duration, error) {
	ranks, recheck := p.r.creations.Pending(p.job, g, g.Missing(), p.now)
	if len(ranks) == 0 {
		return recheck, nil
	}
	if err := p.admission.Unplaceable(); err != nil {
		return recheck, err
	}
	unhealthy, err := p.unhealthyNodes(ctx)
	if err != nil {
		return recheck, err
	}
	network := workerpod.NetworkEnv(&p.job.Spec)
	var created atomic.Int32
	var noCommand atomic.Bool
	var mu sync.Mutex
	var invalid error
	eg, ctx := errgroup.WithContext(ctx)
	eg.SetLimit(p.r.createParallelism())
	for _, rank := range ranks {
		eg.Go(func() error {
			pod := newWorkerPod(p.job, network, rank)
			if skip := workerpod.InjectSupervisor(p.job, pod, p.r.SupervisorImage); skip == workerpod.SupervisorNoCommand {
				noCommand.Store(true)
			}
			workerpod.PreferOtherNodes(&pod.Spec, unhealthy)
			p.admission.Place(pod, admission.Ranks)
			p.marks.stamp(p.job, pod, p.r.Clock.Now()) // at the send: see markWindow
			err := p.r.Create(ctx, pod)
			switch {
			case err == nil:
				created.Add(1)
				podsCreated.Inc()
				g.Ranks[rank] = pod
				p.r.creations.Created(p.job, pod.Name, p.r.Clock.Now()) // not p.now: a big pass takes seconds
			case apierrors.IsAlreadyExists(err):
				if taken := p.checkTaken(ctx, pod, "Pod"); taken != nil {
					return taken // a pod of that name that is not the job's: never a rank
				}
				p.r.creations.Created(p.job, pod.Name, p.r.Clock.Now())
			case namespaceTerminating(err):
				return err
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
	err = eg.Wait()
	if n := created.Load(); n > 0 {
		p.acted(corev1.EventTypeNormal, trainingv1alpha1.ReasonPodsCreated, "Create", "created %d worker pods for attempt %d", n, p.job.Status.Attempt())
		log.FromContext(ctx).V(1).Info("created worker pods", "count", n, "attempt", p.job.Status.Attempt())
	}
	if noCommand.Load() {
		p.acted(corev1.EventTypeWarning, trainingv1alpha1.ReasonSupervisorNotInjected, "Create",
			"%s; until then a rank's peers restart only when the trainer itself exits on losing one (faultTolerance.supervisor)", workerpod.SupervisorNoCommand)
	}
	if invalid != nil {
		p.fail(trainingv1alpha1.ReasonInvalidPodTemplate, "the apiserver refused the worker pod: "+invalid.Error())
	}
	var conflict *nameConflict
	if err != nil && !errors.Is(err, context.Canceled) && !errors.As(err, &conflict) && !namespaceTerminating(err) {
		// Admission refusals (Pod Security, quota, webhooks) say what to change: show them
		// where users look, not only in the operator's log.
		p.acted(corev1.EventTypeWarning, trainingv1alpha1.ReasonFailedCreate, "Create", "%v (retrying)", err)
	}
	return recheck, err
}

// deletePods deletes pods concurrently, each given at most maxGrace seconds to stop (nil: the
// pod's own grace period, so healthy workers can save on SIGTERM; 0 removes the object at once,
// for pods whose kubelet will never confirm). Pods already gone or replaced are fine.
func (p *pass) deletePods(ctx context.Context, pods []*corev1.Pod, maxGrace *int64) error {
	if len(pods) == 0 {
		return nil
	}
	eg, ctx := errgroup.WithContext(ctx)
	eg.SetLimit(p.r.createParallelism())
	for _, pod := range pods {
		p.r.creations.Deleting(p.job, pod.Name)
		eg.Go(func() error {
			opts := []client.DeleteOption{client.Preconditions{UID: &pod.UID}}
			if maxGrace != nil {
				opts = append(opts, client.GracePeriodSeconds(min(*maxGrace, ptr.Deref(pod.Spec.TerminationGracePeriodSeconds, *maxGrace))))
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

// clearStuck force-deletes pods of old attempts that have been terminating longer than
// terminatingTimeout (a dead node's kubelet never confirms), so a restart never waits on them.
// It returns how long until the next one is due, or 0.
func (p *pass) clearStuck(ctx context.Context, draining []*corev1.Pod) (time.Duration, error) {
	timeout := p.job.Spec.FaultTolerance.TerminatingTimeout.Duration
	var next time.Duration
	var stuck []*corev1.Pod
	for _, pod := range draining {
		if due := pod.DeletionTimestamp.Add(timeout).Sub(p.now); due > 0 {
			if next == 0 || due < next {
				next = due
			}
			continue
		}
		stuck = append(stuck, pod)
	}
	// A force delete removes nothing while finalizers remain: say who holds the pod instead
	// of claiming a delete that did not happen.
	if err := p.deletePods(ctx, stuck, ptr.To[int64](0)); err != nil {
		return 0, err
	}
	held := slices.DeleteFunc(slices.Clone(stuck), func(pod *corev1.Pod) bool { return len(pod.Finalizers) == 0 })
	stuck = slices.DeleteFunc(stuck, func(pod *corev1.Pod) bool { return len(pod.Finalizers) > 0 })
	for _, pod := range stuck {
		p.acted(corev1.EventTypeWarning, trainingv1alpha1.ReasonForceDeleted, "Delete",
			"force-deleted pod %s on %s: terminating for more than %s", pod.Name, pod.Spec.NodeName, timeout)
	}
	if len(held) > 0 {
		pod := held[0]
		msg := fmt.Sprintf("waiting for pod %s, terminating for more than %s and held by finalizers %s the operator does not own: "+
			"remove them (kubectl patch pod %s -n %s --type=merge -p '{\"metadata\":{\"finalizers\":null}}') once whatever added them is done",
			pod.Name, timeout, strings.Join(pod.Finalizers, ", "), pod.Name, pod.Namespace)
		if len(held) > 1 {
			msg += fmt.Sprintf(" (and %d more pods)", len(held)-1)
		}
		if p.setCondition(trainingv1alpha1.ConditionRunning, metav1.ConditionFalse, trainingv1alpha1.ReasonBlockedByFinalizer, msg) {
			p.warning(trainingv1alpha1.ReasonBlockedByFinalizer, "Delete", "%s", msg)
		}
	}
	return next, nil
}

// newWorkerPod is rank's pod of the job's current attempt, with what the operator's other
// concerns place on it: the restart mechanism, the quarantined nodes it avoids and the
// spare's node it must take (the admission's placement is added when it is created).
func newWorkerPod(job *trainingv1alpha1.ZayaTrainingJob, network []corev1.EnvVar, rank int32) *corev1.Pod {
	return renderRank(job, network, rank, spareNodeFor(job, rank))
}

// renderRank is rank's pod, kept to node where one is named (a replacement onto the node of
// the spare its rank takes).
func renderRank(job *trainingv1alpha1.ZayaTrainingJob, network []corev1.EnvVar, rank int32, node string) *corev1.Pod {
	return workerpod.Render(job, network, rank, func(pod *corev1.Pod, w *corev1.Container) {
		recovery.SetInPlace(job, pod, w)
		avoidQuarantined(&pod.Spec, job.Status.QuarantinedNodes)
		if node != "" {
			workerpod.RequireNode(&pod.Spec, node)
		}
		if at := nodeLostAt(&job.Status, rank); !at.IsZero() {
			w.Env = append(w.Env, corev1.EnvVar{Name: contract.EnvNodeLostAt, Value: at.UTC().Format(time.RFC3339Nano)})
		}
	})
}

// nodeLostAt is when rank was found lost with its node in the restart under way (zero: it
// is no such replacement): the decision's own microsecond where the last failure is that
// loss, else its replacement record's second, rounded up (status keeps whole seconds), so
// that a replacement's worker never starts before the old one's bound (contract.EnvNodeLostAt).
func nodeLostAt(st *trainingv1alpha1.ZayaTrainingJobStatus, rank int32) time.Time {
	i := slices.IndexFunc(st.Replacing, func(r trainingv1alpha1.ReplacedPod) bool {
		return r.Rank == rank && r.Reason == trainingv1alpha1.FailureReasonNodeLost
	})
	if i < 0 {
		return time.Time{}
	}
	since := st.Replacing[i].Since.Time
	if f := st.LastFailure; f != nil && f.Reason == trainingv1alpha1.FailureReasonNodeLost && ptr.Equal(f.Rank, &rank) &&
		f.Recovery != nil && f.Recovery.Decided != nil && !f.Recovery.Decided.Time.Before(since) {
		return f.Recovery.Decided.Time
	}
	return since.Add(time.Second)
}

// podSizeErrors refuses a job whose worker pods would be too large to store.
func podSizeErrors(job *trainingv1alpha1.ZayaTrainingJob) field.ErrorList {
	return workerpod.SizeErrors(newWorkerPod(job, workerpod.NetworkEnv(&job.Spec), job.Spec.Nodes-1), job.Spec.Nodes)
}

// spareNodeFor is the node of the spare rank takes in the restart under way, "" for none.
func spareNodeFor(job *trainingv1alpha1.ZayaTrainingJob, rank int32) string {
	for _, r := range job.Status.Replacing {
		if r.Rank == rank && r.SpareNode != "" && len(validation.IsDNS1123Subdomain(r.SpareNode)) == 0 {
			return r.SpareNode
		}
	}
	return ""
}

// avoidQuarantined keeps a pod off the job's quarantined nodes: a NotIn on each node's name
// (the apiserver allows one value per node-name field requirement) is added to every required
// node-affinity term of the template (terms are ORed, so each needs them).
func avoidQuarantined(ps *corev1.PodSpec, quarantined []trainingv1alpha1.QuarantinedNode) {
	names := make([]string, len(quarantined))
	for i, q := range quarantined {
		names[i] = q.Name
	}
	workerpod.AvoidNodes(ps, names)
}
