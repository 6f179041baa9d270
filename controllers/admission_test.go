package controllers

import (
	"testing"

	"github.com/zaya-operator/zaya-operator/controllers/recovery"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// The admission counts what the ranks and spares really take: rank 0's pod with the
// supervisor's init container where the ranks get it, and the spares the job holds.
func TestTheAdmissionSeesTheRanksAndSparesTheJobMakes(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(4).WorkerCommand([]string{"torchrun"}, "train.py").Defaulted().Obj()
	job.Spec.FaultTolerance.Spares = 2
	p := &pass{r: &ZayaTrainingJobReconciler{SupervisorImage: "registry.example/zaya-worker:v1"}, job: job}
	rank, spare, spares := p.Shape()
	if len(rank.Spec.InitContainers) != 1 {
		t.Errorf("rank 0 has init containers %v, want the supervisor's", rank.Spec.InitContainers)
	}
	if spares != 2 || spare == nil || spare.Spec.Containers[0].Image != recovery.DefaultSpareImage {
		t.Errorf("spares %d (%v), want 2 of the spare image", spares, spare)
	}
	job.Spec.FaultTolerance.Spares = 0
	if _, spare, spares := p.Shape(); spare != nil || spares != 0 {
		t.Errorf("a job without spares has %d (%v)", spares, spare)
	}
}
