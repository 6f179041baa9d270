package controllers

import (
	"bytes"
	"strings"
	"testing"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// FuzzConstructors feeds jobs built from fuzz input (edge and hostile values included)
// through defaulting, the operator's own validation and the pod, Service and claim
// constructors: nothing may panic. Whether the API server accepts what they build is
// test/integration's TestConstructorsOutputPassesAPIServerValidation, on the same generator.
// make fuzz runs it for a while; go test runs the seeds.
func FuzzConstructors(f *testing.F) {
	for _, seed := range [][]byte{nil, {1, 2, 3, 4, 5, 6, 7, 8}, bytes.Repeat([]byte{7}, 64), bytes.Repeat([]byte{255, 0}, 64)} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		job := testjob.Random(&testjob.Bytes{Data: data}, "llm", "ns")
		job.Default()
		_ = trainingv1alpha1.ValidateSpec(&job.Spec)
		network := networkEnv(&job.Spec)
		_ = newService(job)
		if job.Spec.Checkpoint != nil && job.Spec.Checkpoint.Volume.Size != nil {
			_ = newCheckpointClaim(job)
		}
		if job.Spec.Nodes > 0 {
			_ = newWorkerPod(job, network, 0)
			_ = newWorkerPod(job, network, job.Spec.Nodes-1)
		}
	})
}

func TestOversizedPodsAreRefusedUpFront(t *testing.T) {
	for _, tc := range []struct {
		valueBytes int
		sidecar    bool
		refused    bool
	}{{100 << 10, false, false}, {600 << 10, false, false}, {600 << 10, true, true}, {1100 << 10, false, true}} {
		w := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(1024).WorkerEnv("BLOB", strings.Repeat("x", tc.valueBytes))
		job := w.Defaulted().Obj()
		if tc.sidecar {
			job.Spec.Template.Spec.Containers = append(job.Spec.Template.Spec.Containers, job.Spec.Template.Spec.Containers[0])
			job.Spec.Template.Spec.Containers[1].Name = "sidecar"
		}
		errs := podSizeErrors(job)
		if (len(errs) > 0) != tc.refused {
			t.Errorf("%d KiB value, sidecar %v: errors %v, want refused=%v", tc.valueBytes>>10, tc.sidecar, errs, tc.refused)
		}
		if len(errs) > 0 && !strings.Contains(errs[0].Error(), "spec.template") {
			t.Errorf("the error should name the field: %v", errs[0])
		}
	}
}
