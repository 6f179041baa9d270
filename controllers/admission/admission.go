// Package admission owns the gate a job's gang passes before it runs: none, or a queueing
// system (Kueue's Workload and pod groups: admission/kueuegate). The core asks its Gate for a
// Ticket each pass and carries out what the ticket decides; it never sees a queueing system's
// types. A second system (Volcano's PodGroup, say) is a package that implements Gate and is
// handed to the reconciler in main.go.
package admission

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// Gate is one way jobs are admitted to run.
type Gate interface {
	// For is the gate's view of job for one pass, on the pass's own copy of the job: what the
	// ticket reads is memoized there, never in the pass.
	For(job *trainingv1alpha1.ZayaTrainingJob, host Host) Ticket
	// Lifted are the scheduling gates the system lifts when it admits a rank: a rank they
	// hold waits in the queue, not for nothing.
	Lifted() []string
	// Stopped says whether the system stopped pod (evicted its workload, preempted it), in
	// its own words (by: who; why: its reason), so the failure is the cluster's doing.
	Stopped(pod *corev1.Pod) (by, why string, ok bool)
	// Delegated serves a job this operator does not run here (spec.managedBy names another
	// controller): the gate may still hold something for it, as MultiKueue's worker-cluster
	// Workload.
	Delegated(ctx context.Context, job *trainingv1alpha1.ZayaTrainingJob, host Host) (ctrl.Result, error)
	// Orphans lets go of what the system holds for the jobs named key that are gone or going
	// (all but the job of UID keep; gone: the job of that name is gone or going too), once
	// hold says their pods no longer hold devices; it returns when to look again.
	Orphans(ctx context.Context, key types.NamespacedName, keep types.UID, gone bool, hold PodsHold) (time.Duration, error)
	// Setup adds the gate's watches to the job's controller and registers what else it needs
	// (indexes) with mgr.
	Setup(mgr ctrl.Manager, b *builder.Builder) (*builder.Builder, error)
}

// PodsHold reports whether pods the operator made for the job of uid (named key) still hold
// devices, and when to look again if only the clock can change that.
type PodsHold func(ctx context.Context, key types.NamespacedName, uid types.UID) (bool, time.Duration, error)

// Ticket is a gate's part in one pass of one job.
type Ticket interface {
	// Admit decides whether the gang may run now. A ticket that holds the gang says why on
	// the job (through the Host) before the core stops it.
	Admit(ctx context.Context, pods []corev1.Pod) (Verdict, error)
	// Release hands back what a held job holds (its quota) once none of its pods holds a
	// device; the core calls it after Admit's Hold with Holding.
	Release(ctx context.Context) (time.Duration, error)
	// Place adds what the admission places on a pod the pass creates.
	Place(pod *corev1.Pod, set PodSet)
	// Unplaceable says why no pod may be made now (nil: they may).
	Unplaceable() error
	// Spares caps the warm spares the job may hold under its admission.
	Spares(want int32) int32
	// Queued reports whether ranks of the running attempt wait for the system to admit them
	// (the scheduling gates it lifts), saying so on the job, and whether a wait for it ended
	// in this pass.
	Queued(pods []corev1.Pod) (queued, admittedNow bool)
	// Suspended lets go of what a suspended job holds once its pods are gone.
	Suspended(ctx context.Context, pods []corev1.Pod) error
	// Report tells the system how the job is doing after the pass (failed: the pass ended
	// in an error, and what it decided is not reported) and lets go of what it left.
	Report(ctx context.Context, pods []corev1.Pod, failed bool) error
}

// Decision is what Admit decided.
type Decision int

const (
	// Run says the gang may run.
	Run Decision = iota
	// Hold says the gang may not run now: the core stops it, and a new attempt starts when
	// it runs again.
	Hold
	// Refused says the ticket failed the job (its admission cannot be applied to its pods).
	Refused
)

// Verdict is Admit's answer.
type Verdict struct {
	Decision Decision
	// Retry is when to look again at a held job (0: at its next event).
	Retry time.Duration
	// Holding: the held job holds something the core lets the ticket hand back (Release)
	// once the gang's pods are gone.
	Holding bool
}

// Host is what a ticket may ask of the pass that holds it. Status is edited on the pass's
// copy of the job and written once by the core.
type Host interface {
	Now() time.Time
	// SetCondition sets a condition on the job's status; it reports whether it changed.
	SetCondition(condType string, status metav1.ConditionStatus, reason, message string) bool
	// ClearCondition sets a present condition to False.
	ClearCondition(condType, reason, message string) bool
	// Fail ends the job as failed.
	Fail(reason, message string)
	// Normal queues an event about a decision recorded in status.
	Normal(reason, action, format string, args ...any)
	// Acted queues an event about a call to the API server the ticket made.
	Acted(eventType, reason, action, format string, args ...any)
	// LivePods counts the job's own pods that have not stopped, as the API server has them.
	LivePods(ctx context.Context) (int, error)
	// Shape is the job's ranks and warm spares as the admission counts them: rank 0's pod
	// and spare 0's (nil: the job holds none), rendered from the spec alone.
	Shape() (rank, spare *corev1.Pod, spares int32)
}

// PodSet is which of the job's pods a placement is for.
type PodSet int

// The job's pod sets: its ranks, and its warm spares.
const (
	Ranks PodSet = iota
	Spares
)

// NameConflict is an object the job needs whose name is taken by one that is not the job's:
// the user's to fix.
type NameConflict struct {
	Kind, Name string
}

func (c *NameConflict) Error() string {
	return fmt.Sprintf("%s %s already exists and is not this job's: delete or rename it; the job starts once the name is free", c.Kind, c.Name)
}

// None admits every job at once.
type None struct{}

var _ Gate = None{}

// For is a ticket that admits the job at once.
func (None) For(*trainingv1alpha1.ZayaTrainingJob, Host) Ticket { return open{} }

// Lifted is none: no scheduling gate is None's.
func (None) Lifted() []string { return nil }

// Stopped is never: None stops no pod.
func (None) Stopped(*corev1.Pod) (string, string, bool) { return "", "", false }

// Delegated holds nothing for a job another controller runs.
func (None) Delegated(context.Context, *trainingv1alpha1.ZayaTrainingJob, Host) (ctrl.Result, error) {
	return ctrl.Result{}, nil
}

// Orphans has nothing to let go.
func (None) Orphans(context.Context, types.NamespacedName, types.UID, bool, PodsHold) (time.Duration, error) {
	return 0, nil
}

// Setup adds no watch.
func (None) Setup(_ ctrl.Manager, b *builder.Builder) (*builder.Builder, error) { return b, nil }

// open is None's ticket.
type open struct{}

func (open) Admit(context.Context, []corev1.Pod) (Verdict, error) { return Verdict{Decision: Run}, nil }
func (open) Release(context.Context) (time.Duration, error)       { return 0, nil }
func (open) Place(*corev1.Pod, PodSet)                            {}
func (open) Unplaceable() error                                   { return nil }
func (open) Spares(want int32) int32                              { return want }
func (open) Queued([]corev1.Pod) (bool, bool)                     { return false, false }
func (open) Suspended(context.Context, []corev1.Pod) error        { return nil }
func (open) Report(context.Context, []corev1.Pod, bool) error     { return nil }
