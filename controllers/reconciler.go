package controllers

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/zaya-operator/zaya-operator/controllers/admission"
	"github.com/zaya-operator/zaya-operator/controllers/attribution"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/liveprogress"
	"github.com/zaya-operator/zaya-operator/controllers/nodehealth"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

// The reconciler's settings and what it keeps across passes; Reconcile and the pass are
// zayatrainingjob_controller.go's.

// ZayaTrainingJobReconciler reconciles ZayaTrainingJob objects.
type ZayaTrainingJobReconciler struct {
	client.Client
	Recorder events.EventRecorder
	Clock    clock.PassiveClock
	// CreateParallelism bounds concurrent pod creations per job (default 128).
	CreateParallelism int
	// ProgressInterval spaces a job's status writes that only report launch progress
	// (readyNodes ticking up while ranks start); 0 means 1 s. Condition changes are
	// written at once.
	ProgressInterval time.Duration

	// APIReader reads from the API server, not the cache, for the rare checks the cache
	// cannot answer (whose is an object the job needs the name of); nil uses Client.
	APIReader client.Reader

	// SpareImage is the warm spares' container image (default recovery.DefaultSpareImage).
	SpareImage string
	// SupervisorImage holds zaya-supervisor for faultTolerance.supervisor Inject ("": none
	// injected).
	SupervisorImage string
	// SparePriorityClass is the warm spares' priority class ("": none, the cluster's default;
	// never the template's, so that an idle spare preempts nobody).
	SparePriorityClass string

	// HardwareTaint taints nodes cluster-wide that root hardware failures in several
	// namespaces' jobs; off by default.
	HardwareTaint nodehealth.HardwareTaintPolicy
	// QuarantineTaintMax bounds how long a job's quarantine taint stays on a node (0: 24h);
	// TaintExpiry removes it then.
	QuarantineTaintMax time.Duration

	// Progress polls rank 0 of each running job for its live progress (when it trains again,
	// stragglers); nil polls none, and goodput is accounted from the pods alone.
	Progress *liveprogress.Poller
	// ProgressPollInterval is how often Progress polls a job: a loss waits a few of them for
	// rank 0 to say it trains again.
	ProgressPollInterval time.Duration
	// Supervisors asks the supervisors of ranks their peers stopped over whether they still
	// run, to act on a lost node before its Lease lapses (supervisorprobe.Prober's Ask); nil
	// asks none.
	Supervisors func(ctx context.Context, pods ...*corev1.Pod) []recovery.Reach

	// Admission is the gate a job's gang passes before it runs: Kueue's, from
	// controllers/admission/kueuegate, in main.go. Nil admits every job at once and serves
	// no queue at all, Kueue's pod groups included (their ranks would get spares outside
	// the group): only tests that queue nothing leave it nil. The gate keeps the clients it
	// was made with.
	Admission admission.Gate

	// PodMarkSecret is the Secret (in the operator's own namespace) that keeps the key the
	// operator marks its pods with across restarts; created on first use. Empty keeps the key
	// in memory: pods that existed before the process started are then trusted.
	PodMarkSecret types.NamespacedName

	lastWrite sync.Map       // types.NamespacedName → time.Time of the job's last status write
	tooLarge  sync.Map       // types.NamespacedName → the generation warned of StatusTooLarge
	conflicts sync.Map       // types.NamespacedName → status writes refused in a row with 409
	creations gang.Creations // pods created but not yet in the cache
	marks     markKeys
	rules     rulesSupport                      // whether the API server keeps container restart rules
	patterns  atomic.Pointer[attribution.Table] // the failure patterns in use; nil: the shipped ones
}

func (r *ZayaTrainingJobReconciler) apiReader() client.Reader {
	if r.APIReader != nil {
		return r.APIReader
	}
	return r.Client
}

// podMarkKey is the key the operator marks its pods with (PodMarkSecret).
func (r *ZayaTrainingJobReconciler) podMarkKey(ctx context.Context) (*markKey, error) {
	return r.marks.get(ctx, r.Client, r.apiReader(), r.PodMarkSecret, r.Clock)
}
