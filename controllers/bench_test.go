package controllers

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// BenchmarkNewWorkerPod is the CPU cost of building one rank's pod (the operator's own work
// per pod, apart from the API call).
func BenchmarkNewWorkerPod(b *testing.B) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(1024).NewCheckpoint("10Ti", "").Defaulted().Obj()
	network := workerpod.NetworkEnv(&job.Spec)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		_ = newWorkerPod(job, network, int32(i%1024))
	}
}

// BenchmarkSteadyStatePass is one reconcile of a running gang of N ranks that changes
// nothing: the cost every pod event pays.
func BenchmarkSteadyStatePass(b *testing.B) {
	for _, n := range []int32{128, 1024} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(n).Generation(1).Defaulted().Obj()
			cl := fake.NewClientBuilder().WithScheme(testScheme()).WithObjects(job).
				WithStatusSubresource(&trainingv1alpha1.ZayaTrainingJob{}, &corev1.Pod{}).
				WithIndex(&corev1.Pod{}, podOwnerKey, indexOwningJob).Build()
			r := &ZayaTrainingJobReconciler{Client: cl, Recorder: events.NewFakeRecorder(1 << 16), Clock: clocktesting.NewFakePassiveClock(now)}
			req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(job)}
			ctx := context.Background()
			if _, err := r.Reconcile(ctx, req); err != nil {
				b.Fatal(err)
			}
			pods := &corev1.PodList{}
			if err := cl.List(ctx, pods); err != nil {
				b.Fatal(err)
			}
			for i := range pods.Items {
				p := &pods.Items[i]
				running("node-" + p.Name)(p)
				if err := cl.Status().Update(ctx, p); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := r.Reconcile(ctx, req); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := r.Reconcile(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRecovery is the operator's side of one gang restart of N ranks after a worker
// crash, in place and by recreating the pods: from the fault in the pods' status to the job's
// Recovered condition, on the fake client. It reports the API writes the operator made
// (writes/op) and the pods it replaced (pods-replaced/op). The kubelets' part (restarting the
// containers, starting the new pods) is played with the timer stopped.
func BenchmarkRecovery(b *testing.B) {
	for _, mode := range []trainingv1alpha1.RestartMode{trainingv1alpha1.RestartModeInPlace, trainingv1alpha1.RestartModeRecreate} {
		for _, n := range []int32{128, 512, 2048} {
			b.Run(fmt.Sprintf("%s/%d", mode, n), func(b *testing.B) {
				job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(n).Generation(1).RestartMode(mode).Defaulted().Obj()
				job.Spec.FaultTolerance.MaxRestarts = ptr.To[int32](1000)
				h := newHarness(b, interceptor.Funcs{}, job)
				h.events = nil
				h.r.Recorder = events.NewFakeRecorder(1 << 20)
				h.mustReconcile(b, job)
				h.runAll(b)
				h.mustReconcile(b, job)
				var writes, replaced int64
				clock := now
				for k := int32(1); b.Loop(); k++ {
					b.StopTimer()
					clock = clock.Add(time.Minute)
					h.r.Clock = clockAt(clock)
					fault := clock.Add(-30 * time.Second)
					attempt := h.get(b, job).Status.Attempt()
					before := h.pods(b)
					crashed := k % n // a new node each time: a node failing again and again is quarantined
					if mode == trainingv1alpha1.RestartModeInPlace {
						for r := range n { // one rank crashed, the others stopped with it, all back
							code := int32(trainingv1alpha1.ExitStopped)
							if r == crashed {
								code = 1
							}
							h.setPod(b, workerpod.PodName(job, attempt, r), restartedInPlace("node-"+workerpod.PodName(job, 0, r), k, code, fault, fault.Add(time.Second)))
						}
					} else {
						h.setPod(b, workerpod.PodName(job, attempt, crashed), exited("node-"+workerpod.PodName(job, 0, crashed), 1, fault))
					}
					for passes := 0; ; passes++ {
						if passes == 10 {
							b.Fatalf("restart %d not recovered after %d passes", k, passes)
						}
						b.StartTimer()
						w := h.writes.Load()
						h.mustReconcile(b, job)
						writes += int64(h.writes.Load() - w)
						b.StopTimer()
						if c := condition(h.get(b, job), trainingv1alpha1.ConditionRestarting); c != nil && c.Reason == trainingv1alpha1.ReasonRecovered && passes > 0 {
							break
						}
						h.runAll(b) // the new attempt's pods start (a no-op in place)
					}
					for name, p := range h.pods(b) {
						if old, ok := before[name]; !ok || old.UID != p.UID {
							replaced++
						}
					}
					b.StartTimer()
				}
				b.ReportMetric(float64(writes)/float64(b.N), "writes/op")
				b.ReportMetric(float64(replaced)/float64(b.N), "pods-replaced/op")
			})
		}
	}
}

// BenchmarkResize is the operator's side of one elastic shrink and grow of a gang of N
// ranks, on the fake client: the last rank has waited for a node past shrinkAfter, the gang
// restarts on N-1 ranks, its holder for the missing node runs, and the gang grows back to N
// (its workers report no progress, so without waiting for a checkpoint). It reports the API
// writes the operator made (writes/op); the kubelets' part (new pods starting) is played
// with the timer stopped.
func BenchmarkResize(b *testing.B) {
	for _, n := range []int32{128, 2048} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(n).Generation(1).
				Elastic(n/2, 10*time.Second, 10*time.Second).Defaulted().Obj()
			h := newHarness(b, interceptor.Funcs{}, job)
			h.events = nil
			h.r.Recorder = events.NewFakeRecorder(1 << 20)
			h.mustReconcile(b, job)
			h.runAll(b)
			h.mustReconcile(b, job)
			var writes int64
			clock := now
			for b.Loop() {
				b.StopTimer()
				clock = clock.Add(time.Hour)
				h.r.Clock = clockAt(clock)
				st := h.get(b, job).Status
				h.setPod(b, workerpod.PodName(job, st.Attempt(), n-1), func(p *corev1.Pod) {
					p.Spec.NodeName = ""
					p.Status = corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled,
						Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, LastTransitionTime: metav1.NewTime(clock.Add(-time.Minute))}}}
				})
				resizes := st.Resizes
				for passes := 0; ; passes++ {
					if passes == 20 {
						b.Fatalf("no shrink and grow after %d passes: %+v", passes, h.get(b, job).Status)
					}
					b.StartTimer()
					w := h.writes.Load()
					h.mustReconcile(b, job)
					writes += int64(h.writes.Load() - w)
					b.StopTimer()
					got := h.get(b, job).Status
					if got.Resizes == resizes+2 && got.ReadyNodes == n {
						break
					}
					h.runAll(b) // the new attempt's pods, and the holder, start
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(writes)/float64(b.N), "writes/op")
		})
	}
}
