// Package kueuegate admits jobs through Kueue, in both of its ways: a job that names a queue
// is one Kueue Workload the operator makes and owns (workload.go, admit.go), and a job whose
// pod template names one is a Kueue pod group per attempt (podgroup.go). It owns the
// Workload's life, the admission's placement of the pods, what a held, suspended or finished
// job hands back, and what a deleted job left behind (orphans.go). The core sees it only as
// an admission.Gate.
package kueuegate

import (
	"context"
	"errors"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/admission"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
	"github.com/zaya-operator/zaya-operator/internal/kueue"
)

// Gate is Kueue's admission. Pod groups are always served (a template that names a queue is
// gated by Kueue's own webhook); Workloads only when the operator runs with them.
type Gate struct {
	client.Client
	reader    client.Reader // the API server itself, for what the cache may not have seen yet
	workloads bool
	// gone: the UID of a job's Workload the gate deleted, by job, until the cache sees it go.
	gone sync.Map
}

var _ admission.Gate = (*Gate)(nil)

// New is Kueue's gate on c (cached reads) and reader (live ones); workloads runs jobs that name
// a queue as Workloads (Kueue's CRDs installed, the kind in its externalFrameworks).
func New(c client.Client, reader client.Reader, workloads bool) *Gate {
	if reader == nil {
		reader = c
	}
	return &Gate{Client: c, reader: reader, workloads: workloads}
}

// ticket is the gate's part in one pass; what it reads of Kueue is memoized here.
type ticket struct {
	g    *Gate
	job  *trainingv1alpha1.ZayaTrainingJob
	host admission.Host

	// workload is the job's Workload (nil: none); place what its admission adds to the
	// pods of each pod set; placeErr keeps pods from being made while it cannot be read.
	workload *kueue.Workload
	place    map[string]*podPlacement
	placeErr error
	// managed memoizes inKueue, owned ownWorkload.
	checked, managed bool
	ownedChecked     bool
	owned            *kueue.Workload
	// reshaped: the job's ranks no longer are what its Workload admitted (edited while
	// suspended); the gang may not run under it.
	reshaped bool
}

// For is Kueue's part in one pass of job.
func (g *Gate) For(job *trainingv1alpha1.ZayaTrainingJob, host admission.Host) admission.Ticket {
	return &ticket{g: g, job: job, host: host}
}

// Lifted are the scheduling gates Kueue lifts when it admits a rank.
func (g *Gate) Lifted() []string { return admissionGates }

// terminationTarget is the condition Kueue's pod integration sets on the pods of a workload
// it stops, before deleting them.
const terminationTarget corev1.PodConditionType = "TerminationTarget"

// Stopped says whether Kueue stopped pod (evicted, preempted, deactivated its workload).
func (g *Gate) Stopped(pod *corev1.Pod) (string, string, bool) {
	c := gang.Condition(pod, terminationTarget)
	if c == nil || c.Status != corev1.ConditionTrue {
		return "", "", false
	}
	return "Kueue", c.Reason + ": " + c.Message, true
}

// Setup watches the Workloads the jobs own and indexes them by job.
func (g *Gate) Setup(mgr ctrl.Manager, b *builder.Builder) (*builder.Builder, error) {
	if !g.workloads {
		return b, nil
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &kueue.Workload{}, workerpod.OwnerIndex, indexWorkloadJob); err != nil {
		return nil, err
	}
	return b.Owns(&kueue.Workload{}), nil
}

// indexWorkloadJob indexes a Workload by the job that controls it, or an ownerless one by
// the job it was orphaned from (its job-name label): a pass reads its job's without a
// namespace's worth of copies.
func indexWorkloadJob(o client.Object) []string {
	if metav1.GetControllerOf(o) == nil && o.GetLabels()[trainingv1alpha1.JobNameLabel] != "" {
		return []string{o.GetLabels()[trainingv1alpha1.JobNameLabel]}
	}
	if name, ok := workerpod.OwningJob(o); ok {
		return []string{name}
	}
	return nil
}

// Orphans lets go of a gone job's pod groups at once and of its Workloads once its pods are
// gone; while the job lives, of the Workloads of an earlier job of its name.
func (g *Gate) Orphans(ctx context.Context, key types.NamespacedName, keep types.UID, gone bool, hold admission.PodsHold) (time.Duration, error) {
	wait, err := g.releaseOrphanedWorkloads(ctx, key, keep, hold)
	if gone {
		g.gone.Delete(key)
		err = errors.Join(err, g.releaseOrphanedGroupPods(ctx, key))
	}
	if err != nil {
		return 0, err
	}
	return wait, nil
}
