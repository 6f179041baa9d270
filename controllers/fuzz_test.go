package controllers

import (
	"bytes"
	"encoding/json"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// FuzzConstructors feeds jobs built from fuzz input (edge and hostile values included)
// through defaulting, the operator's own validation and the pod, Service and claim
// constructors, and checks what must hold for every job: the constructors are pure (same
// input, same output; the job is not changed), every pod of a job the operator accepts fits
// in etcd, round-trips through JSON, names its rank and attempt consistently and carries the
// contract exactly once. Whether the API server accepts what they build is
// test/integration's TestConstructorsOutputPassesAPIServerValidation, on the same generator.
// make fuzz runs it for a while; go test runs the seeds.
func FuzzConstructors(f *testing.F) {
	for _, seed := range [][]byte{nil, {1, 2, 3, 4, 5, 6, 7, 8}, bytes.Repeat([]byte{7}, 64), bytes.Repeat([]byte{255, 0}, 64)} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		job := testjob.Random(&testjob.Bytes{Data: data}, "llm", "ns")
		job.Default()
		accepted := len(trainingv1alpha1.ValidateSpec(&job.Spec)) == 0
		before := job.DeepCopy()

		network := workerpod.NetworkEnv(&job.Spec)
		if !apiequality.Semantic.DeepEqual(network, workerpod.NetworkEnv(&job.Spec)) {
			t.Fatal("NetworkEnv is not deterministic")
		}
		seen := map[string]bool{}
		for _, e := range network {
			if seen[e.Name] {
				t.Errorf("NetworkEnv sets %s twice", e.Name)
			}
			seen[e.Name] = true
		}
		if svc := workerpod.Service(job); svc.Name != job.Name || svc.Spec.Selector[trainingv1alpha1.JobNameLabel] != job.Name {
			t.Errorf("service %s selects %v, want the job's pods", svc.Name, svc.Spec.Selector)
		}
		if c := job.Spec.Checkpoint; c != nil && c.Volume.Size != nil {
			pvc := workerpod.CheckpointClaim(job)
			if got := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; got.Cmp(*c.Volume.Size) != 0 {
				t.Errorf("claim requests %s, spec asks %s", got.String(), c.Volume.Size.String())
			}
		}
		if job.Spec.Nodes > 0 {
			for _, rank := range []int32{0, job.Spec.Nodes - 1} {
				checkWorkerPod(t, job, network, rank, accepted && len(podSizeErrors(job)) == 0)
			}
		}
		if diff := cmp.Diff(before, job); diff != "" {
			t.Errorf("the constructors changed the job (-before +after):\n%s", diff)
		}
	})
}

// checkWorkerPod checks what every worker pod of job must satisfy; fits says the operator
// accepted the job, so the pod must also be small enough to store.
func checkWorkerPod(t *testing.T, job *trainingv1alpha1.ZayaTrainingJob, network []corev1.EnvVar, rank int32, fits bool) {
	t.Helper()
	pod := newWorkerPod(job, network, rank)
	if !apiequality.Semantic.DeepEqual(pod, newWorkerPod(job, network, rank)) {
		t.Fatalf("rank %d: newWorkerPod is not deterministic", rank)
	}
	b, err := json.Marshal(pod)
	if err != nil {
		t.Fatalf("rank %d: %v", rank, err)
	}
	if fits && len(b) > workerpod.MaxPodBytes {
		t.Errorf("rank %d: an accepted job's pod is %d bytes, over %d", rank, len(b), workerpod.MaxPodBytes)
	}
	back := &corev1.Pod{}
	if err := json.Unmarshal(b, back); err != nil || !apiequality.Semantic.DeepEqual(pod, back) {
		t.Errorf("rank %d: the pod does not survive a JSON round trip (%v)", rank, err)
	}
	if got, ok := gang.Rank(pod); !ok || got != rank || pod.Labels[trainingv1alpha1.AttemptLabel] != strconv.Itoa(int(job.Status.Restarts)) ||
		pod.Name != workerpod.PodName(job, job.Status.Restarts, rank) {
		t.Errorf("pod %s labelled rank %q attempt %q, want rank %d attempt %d", pod.Name,
			pod.Labels[trainingv1alpha1.RankLabel], pod.Labels[trainingv1alpha1.AttemptLabel], rank, job.Status.Restarts)
	}
	if owner, ok := workerpod.OwningJob(pod); !ok || owner != job.Name {
		t.Errorf("pod %s is controlled by %q, want %s", pod.Name, owner, job.Name)
	}
	w := &pod.Spec.Containers[workerpod.WorkerContainer(&pod.Spec)]
	if gpus := w.Resources.Limits["amd.com/gpu"]; gpus.Cmp(*resource.NewQuantity(int64(job.Spec.GPUsPerNode), resource.DecimalSI)) != 0 {
		t.Errorf("rank %d: worker limits %s GPUs, spec asks %d", rank, gpus.String(), job.Spec.GPUsPerNode)
	}
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		n := 0
		for _, e := range c.Env {
			if e.Name == trainingv1alpha1.EnvNodeRank {
				n++
				if fits && e.Value != strconv.Itoa(int(rank)) {
					t.Errorf("rank %d: container %s has %s=%s", rank, c.Name, e.Name, e.Value)
				}
			}
		}
		if fits && n != 1 { // the API refuses templates that set it themselves
			t.Errorf("rank %d: container %s sets %s %d times", rank, c.Name, trainingv1alpha1.EnvNodeRank, n)
		}
	}
	if pod.Spec.AutomountServiceAccountToken == nil ||
		(*pod.Spec.AutomountServiceAccountToken && !ptrTrue(job.Spec.Template.Spec.AutomountServiceAccountToken)) {
		t.Errorf("rank %d: service-account token mounted without the template asking", rank)
	}
}

func ptrTrue(b *bool) bool { return b != nil && *b }
