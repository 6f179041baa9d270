package controllers

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// BenchmarkNewWorkerPod is the CPU cost of building one rank's pod (the operator's own work
// per pod, apart from the API call).
func BenchmarkNewWorkerPod(b *testing.B) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(1024).NewCheckpoint("10Ti", "").Defaulted().Obj()
	network := networkEnv(&job.Spec)
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
				WithIndex(&corev1.Pod{}, podOwnerKey, indexPodOwner).Build()
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
