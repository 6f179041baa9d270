package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/zaya-operator/zaya-operator/api/contract"
	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/crdschema"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

var crdValidator = sync.OnceValues(func() (*crdschema.Validator, error) {
	return crdschema.Load(filepath.Join("..", "config", "crd", "bases", "training.zaya.dev_zayatrainingjobs.yaml"), "v1alpha1")
})

func schemaOf(t testing.TB) *crdschema.Validator {
	t.Helper()
	v, err := crdValidator()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func pickOf[T any](s testjob.Source, vs ...T) T { return vs[s.IntN(len(vs))] }

// hostileTime is a moment anyone with status access could have stored: near now, long ago,
// or far ahead.
func hostileTime(s testjob.Source) time.Time {
	return now.Add(pickOf(s, -time.Minute, 0, time.Second, -400*24*time.Hour, 100*365*24*time.Hour, -2*time.Hour, 5*time.Minute))
}

func hostileInt64(s testjob.Source) int64 {
	return pickOf[int64](s, 0, 1, 40, 1e9, contract.MaxStep, math.MaxInt64-1, math.MaxInt64)
}

func hostileInt32(s testjob.Source) int32 {
	return pickOf[int32](s, 0, 1, 3, 999_999_999, 1_000_000_000, math.MaxInt32)
}

// hostileStatus is a status someone with status access could have written: anything the
// schema accepts, near its bounds (the schema decides: a status it refuses is never stored).
func hostileStatus(s testjob.Source) trainingv1alpha1.ZayaTrainingJobStatus {
	st := trainingv1alpha1.ZayaTrainingJobStatus{
		Restarts: hostileInt32(s), InPlaceRestarts: hostileInt32(s), ContainerRestarts: hostileInt64(s),
		ReadySpares: hostileInt32(s), SparesTaken: hostileInt32(s), PodsReplaced: hostileInt32(s), ReadyNodes: hostileInt32(s),
		ObservedGeneration: pickOf[int64](s, 0, 1, math.MaxInt64),
		LastRestartMode:    pickOf(s, trainingv1alpha1.RestartModeInPlace, trainingv1alpha1.RestartModeRecreate, ""),
	}
	st.InPlaceRestarts = min(st.InPlaceRestarts, st.Restarts)
	ours := []string{trainingv1alpha1.ConditionCreated, trainingv1alpha1.ConditionRunning, trainingv1alpha1.ConditionRestarting,
		trainingv1alpha1.ConditionFailed, trainingv1alpha1.ConditionSucceeded}
	for i := range pickOf(s, 0, 2, 5, 15, 16) {
		typ := fmt.Sprintf("Forged%d", i)
		if s.IntN(3) == 0 && i < len(ours) {
			typ = ours[i]
		}
		st.Conditions = append(st.Conditions, metav1.Condition{Type: typ, Status: pickOf(s, metav1.ConditionTrue, metav1.ConditionFalse, metav1.ConditionUnknown),
			Reason: pickOf(s, "Forged", trainingv1alpha1.ReasonAccepted), Message: pickOf(s, "", strings.Repeat("m", 32768)),
			LastTransitionTime: metav1.NewTime(hostileTime(s)), ObservedGeneration: pickOf[int64](s, 0, 1, math.MaxInt64)})
	}
	if s.IntN(2) == 0 {
		st.StartTime = ptr.To(metav1.NewTime(hostileTime(s)))
	}
	if s.IntN(4) == 0 {
		st.CompletionTime = ptr.To(metav1.NewTime(hostileTime(s)))
	}
	for range pickOf(s, 0, 1, 8) {
		st.RecentFailures = append(st.RecentFailures, trainingv1alpha1.JobFailure{Time: metav1.NewTime(hostileTime(s)), Reason: trainingv1alpha1.FailureReasonExitCode,
			Attempt: hostileInt32(s), Node: "node-llm-0-1", Rank: ptr.To(hostileInt32(s)), Category: "Unknown", Cascaded: hostileInt32(s)})
	}
	if len(st.RecentFailures) > 0 {
		st.LastFailure = st.RecentFailures[0].DeepCopy()
	}
	for range pickOf(s, 0, 3, 1024) {
		st.RestartTimes = append(st.RestartTimes, metav1.NewTime(hostileTime(s)))
	}
	for i := range pickOf(s, 0, 2, 256) {
		st.QuarantinedNodes = append(st.QuarantinedNodes, trainingv1alpha1.QuarantinedNode{Name: fmt.Sprintf("q%d", i), Reason: "NodeLost", Since: metav1.NewTime(hostileTime(s))})
	}
	if s.IntN(2) == 0 {
		st.LastCheckpoint = &trainingv1alpha1.CheckpointStatus{Step: hostileInt64(s), Time: ptr.To(metav1.NewTime(hostileTime(s)))}
	}
	if s.IntN(3) == 0 {
		st.LastResume = &trainingv1alpha1.ResumeStatus{Attempt: hostileInt32(s), Step: hostileInt64(s), StepsLost: hostileInt64(s)}
	}
	for range pickOf(s, 0, 1, 16) {
		st.CorruptCheckpoints = append(st.CorruptCheckpoints, trainingv1alpha1.CorruptCheckpoint{Step: hostileInt64(s),
			MovedTo: pickOf(s, "", strings.Repeat("c", 253)), Reason: pickOf(s, "", strings.Repeat("é", 512)), Time: metav1.NewTime(hostileTime(s))})
	}
	if s.IntN(3) == 0 {
		st.LastRecoverySeconds = ptr.To(hostileInt32(s))
	}
	if s.IntN(4) != 0 {
		g := &trainingv1alpha1.GoodputStatus{AsOf: metav1.NewMicroTime(hostileTime(s)), WallMilliseconds: hostileInt64(s),
			StartupMilliseconds: hostileInt64(s), LostMilliseconds: hostileInt64(s), TrainingMilliseconds: hostileInt64(s),
			EffectiveTrainingTime: pickOf(s, "", "100.0%", "12345678")}
		for i := range pickOf(s, 0, 1, 16) {
			g.Lost = append(g.Lost, trainingv1alpha1.GoodputLoss{Category: pickOf(s, "Unknown", fmt.Sprintf("C%d", i)), Failures: hostileInt32(s),
				DownMilliseconds: hostileInt64(s), RecomputeMilliseconds: hostileInt64(s)})
		}
		if s.IntN(2) == 0 {
			g.Open = &trainingv1alpha1.GoodputOpen{Category: pickOf(s, "", "Unknown"), Since: metav1.NewMicroTime(hostileTime(s)),
				ReachedStep: hostileInt64(s), CheckpointStep: hostileInt64(s), StepMicroseconds: hostileInt64(s)}
			if s.IntN(2) == 0 {
				g.Open.RanAt = ptr.To(metav1.NewMicroTime(hostileTime(s)))
			}
		}
		if s.IntN(2) == 0 {
			g.TrainingSince = ptr.To(metav1.NewMicroTime(hostileTime(s)))
		}
		st.Goodput = g
	}
	return st
}

// hostileExit is what a tenant's worker may leave in its termination message: the progress
// lines with numbers at and past every bound, and times far off.
func hostileExit(s testjob.Source) string {
	t := hostileTime(s).Format(time.RFC3339Nano)
	return strings.Join([]string{
		"training-step=" + pickOf(s, "120", "9223372036854775807", "1125899906842624", "-5", "1e9"),
		"checkpoint-step=" + pickOf(s, "100", "9223372036854775807", "1125899906842624"),
		"checkpoint-restored=" + pickOf(s, "40", "9223372036854775807"),
		"step-seconds=" + pickOf(s, "0.5", "1e-300", "86399", "NaN"),
		"training-since=" + t,
		"last-step-at=" + pickOf(s, t, now.Format(time.RFC3339Nano)),
		pickOf(s, "", "zaya: checkpoint-corrupt: step=9223372036854775807 moved to x", gpuFaultLine,
			"zaya: checkpoint-corrupt: step=7 moved to corrupt-step-7-1: "+strings.Repeat("\xff", 4000)),
	}, "\n")
}

// statusRefusals checks every status write of the harness against the CRD, refusing what the
// API server would, as it would (the write fails with Invalid).
func statusRefusals(t testing.TB, refused *[]string) interceptor.Funcs {
	v := schemaOf(t)
	return interceptor.Funcs{SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
		if job, ok := obj.(*trainingv1alpha1.ZayaTrainingJob); ok && sub == "status" {
			if errs := v.Validate(job); len(errs) > 0 {
				g, _ := json.Marshal(job.Status.Goodput)
				*refused = append(*refused, errs.ToAggregate().Error()+"; goodput "+string(g))
				return apierrors.NewInvalid(schema.GroupKind{Group: trainingv1alpha1.GroupVersion.Group, Kind: "ZayaTrainingJob"}, job.Name, errs)
			}
		}
		return c.SubResource(sub).Update(ctx, obj, opts...)
	}}
}

// checkStatusStaysValid stores a hostile status the schema accepts, lets a rank fail with a
// hostile termination message and reconciles: every status the operator writes must be one
// the schema accepts, and the failure must be acted on.
func checkStatusStaysValid(t *testing.T, s testjob.Source) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(3).Generation(1).Defaulted().Obj()
	job.Spec.FaultTolerance.RestartMode = pickOf(s, trainingv1alpha1.RestartModeInPlace, trainingv1alpha1.RestartModeRecreate)
	var status trainingv1alpha1.ZayaTrainingJobStatus
	if s.IntN(4) != 0 {
		status = hostileStatus(s)
	}
	exit := hostileExit(s)
	stored := job.DeepCopy()
	stored.Status = status
	if errs := schemaOf(t).Validate(stored); len(errs) > 0 {
		t.Skipf("never stored: %v", errs.ToAggregate())
	}
	var refused []string
	h := newHarness(t, statusRefusals(t, &refused), job)
	h.events = events.NewFakeRecorder(1 << 12) // a hostile status may release hundreds of nodes, each with an event
	h.r.Recorder = h.events
	w := &fakeWorkers{}
	withWorkers(h, w)
	h.mustReconcile(t, job) // accepted, pods created
	h.runAll(t)
	// Rank 0 reports whatever its tenant's code makes up.
	for name := range h.pods(t) {
		if strings.HasSuffix(name, "-0") {
			h.setPod(t, name, runningAt("node-"+name, "10.0.0.1"))
		}
	}
	w.set("10.0.0.1", contract.Progress{Step: hostileInt64(s), CheckpointStep: hostileInt64(s), ResumedFrom: hostileInt64(s),
		StepSeconds: pickOf(s, 0.5, 1e-300, 86399, math.Inf(1)), TrainingSince: hostileTime(s), LastStepAt: hostileTime(s), StartedAt: hostileTime(s), MetAt: hostileTime(s)})
	// The hostile status lands now, as a status writer's edit between two passes.
	cur := h.get(t, job)
	cur.Status = status
	if err := h.r.Status().Update(context.Background(), cur); err != nil {
		t.Fatalf("storing the status the schema accepts: %v", err)
	}
	pods := h.pods(t)
	var victim string
	for name := range pods {
		if strings.HasSuffix(name, "-1") {
			victim = name
		}
	}
	if victim == "" {
		return // the stored status stopped the job (a forged Failed, a counter at its bound): nothing more to see
	}
	// After every time a status writer may store in the past (the operator never writes ahead
	// of its clock): an exit no newer than the last failure is that failure's, accounted for.
	exitAt := now.Add(2 * time.Second)
	if job.Spec.FaultTolerance.RestartMode == trainingv1alpha1.RestartModeInPlace && s.IntN(2) == 0 {
		h.setPod(t, victim, func(p *corev1.Pod) {
			restartedInPlace("node-"+victim, 1, 1, exitAt, exitAt.Add(time.Second))(p)
			p.Status.ContainerStatuses[0].LastTerminationState.Terminated.Message = exit
		})
	} else {
		h.setPod(t, victim, exitedSaying("node-"+victim, 1, exitAt, "", exit))
	}
	for i := range 4 {
		h.r.Clock.(interface{ SetTime(time.Time) }).SetTime(exitAt.Add(time.Second + time.Duration(i)*7*time.Second))
		_, _ = h.reconcile(t, job)
		h.drainEvents()
	}
	got := h.get(t, job)
	finished := meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionFailed) ||
		meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionSucceeded)
	// A stored status that names another attempt moves the gang there (its pods are made
	// anew): rank 1's exit is then an old attempt's, rightly ignored.
	sameAttempt := status.Attempt() == 0 && status.Restarts < trainingv1alpha1.MaxStatusCount
	if sameAttempt && got.Status.Restarts <= status.Restarts && !finished {
		t.Errorf("rank 1's failure was not acted on: restarts %d (stored %d), conditions %v", got.Status.Restarts, status.Restarts, conditionSummary(got.Status.Conditions))
	}
	if len(refused) > 0 {
		t.Errorf("the operator wrote %d status(es) its own CRD refuses, the first: %s\nexit: %q", len(refused), refused[0], exit)
	}
}

// TestTheOperatorNeverWritesAStatusItsSchemaRefuses is the property over the whole status:
// whatever a status writer stored (within the schema) and whatever a rank's exit says, the
// next status the operator computes validates against the CRD's OpenAPI schema and CEL rules.
func TestTheOperatorNeverWritesAStatusItsSchemaRefuses(t *testing.T) {
	for seed := range uint64(150) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { checkStatusStaysValid(t, rand.New(rand.NewPCG(seed, 35))) })
	}
}

func FuzzStatusStaysValid(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8})
	f.Fuzz(func(t *testing.T, data []byte) { checkStatusStaysValid(t, &testjob.Bytes{Data: data}) })
}

func conditionSummary(conds []metav1.Condition) string {
	var out []string
	for _, c := range conds {
		out = append(out, c.Type+"="+string(c.Status)+"/"+c.Reason)
	}
	return strings.Join(out, " ")
}
