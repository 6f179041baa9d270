//go:build e2e

package e2e

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// TestASupervisedWorkersFatalExitFailsTheJob: under zaya-supervisor (pod restartPolicy
// OnFailure, which would restart any failed container) a worker's exit 78 is not restarted:
// the supervisor ends its container with 0 and exit-code=78, and the operator fails the job
// at once, naming the rank and the code, as it does under restart rules. A retryable exit of
// the other rank's worker, before it, restarted the gang in place without a new pod.
func TestASupervisedWorkersFatalExitFailsTheJob(t *testing.T) {
	procs := w.processes(t, 2)
	ns := newNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	job := testjob.MakeZayaTrainingJob("sup", ns).Nodes(2).GPUsPerNode(1).Profile(trainingv1alpha1.NetworkSocket).Obj()
	job.Spec.FaultTolerance.InPlaceMechanism = trainingv1alpha1.InPlaceMechanismSupervisor
	ps := &job.Spec.Template.Spec
	procs.place(ps)
	// Rank 0's first run exits 3 (retryable); its second, and rank 1's once rank 0 is back,
	// wait. Then rank 1 exits 78. The runs count themselves in the pod's emptyDir (/dev/shm).
	ps.Containers[0].Command = []string{"zaya-supervisor", "--", "/bin/sh", "-c", `
n=$(cat "$ZAYA_HEARTBEAT_FILE.runs" 2>/dev/null || echo 0); echo $((n+1)) > "$ZAYA_HEARTBEAT_FILE.runs"
touch "$ZAYA_HEARTBEAT_FILE"
if [ "$NODE_RANK" = 0 ] && [ "$n" = 0 ]; then sleep 2; exit 3; fi
if [ "$NODE_RANK" = 1 ] && [ "$n" = 0 ]; then sleep 2; exit 75; fi
if [ "$NODE_RANK" = 1 ]; then sleep 3; echo "checkpoint-step=7" >> "$ZAYA_TERMINATION_LOG"; exit 78; fi
while :; do touch "$ZAYA_HEARTBEAT_FILE"; sleep 1; done`}
	ps.Containers[0].Args = nil
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	t.Cleanup(func() {
		if t.Failed() {
			logJobState(t, job)
		}
		_ = k8sClient.Delete(context.Background(), job)
	})

	var got *trainingv1alpha1.ZayaTrainingJob
	g.Eventually(func(g Gomega) {
		got = getJob(g, job)
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionFailed)).To(BeTrue())
	}, gangTimeout, interval).Should(Succeed())
	c := meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionFailed)
	g.Expect(c.Reason).To(Equal(trainingv1alpha1.ReasonFatalFailure), "%+v", c)
	f := got.Status.LastFailure
	g.Expect(f).NotTo(BeNil())
	g.Expect(*f.Rank).To(Equal(int32(1)))
	g.Expect(*f.ExitCode).To(Equal(int32(78)))
	g.Expect(got.Status.InPlaceRestarts).To(Equal(int32(1)), "rank 0's exit 3 restarted the gang in place")
	g.Expect(got.Status.RestartMechanism).To(Equal(trainingv1alpha1.RestartMechanismSupervisor))
	g.Expect(got.Status.LastCheckpoint).NotTo(BeNil())
	g.Expect(got.Status.LastCheckpoint.Step).To(Equal(int64(7)))
	g.Expect(got.Status.Attempt()).To(Equal(int32(0)), "the pods of attempt 0 are the only ones the job had")
}
