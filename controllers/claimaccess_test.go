package controllers

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

func TestClaimAccessModes(t *testing.T) {
	claim := func(spec, bound []corev1.PersistentVolumeAccessMode) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "ckpt"},
			Spec: corev1.PersistentVolumeClaimSpec{AccessModes: spec}, Status: corev1.PersistentVolumeClaimStatus{AccessModes: bound}}
	}
	rwo, rwx, rox, rwop := corev1.ReadWriteOnce, corev1.ReadWriteMany, corev1.ReadOnlyMany, corev1.ReadWriteOncePod
	modes := func(m ...corev1.PersistentVolumeAccessMode) []corev1.PersistentVolumeAccessMode { return m }
	for _, c := range []struct {
		name          string
		nodes         int32
		claim         *corev1.PersistentVolumeClaim
		refused, warn string
	}{
		{"many nodes on ReadWriteMany", 4, claim(modes(rwx), nil), "", ""},
		{"the bound volume's modes count", 4, claim(modes(rwo), modes(rwo, rwx)), "", ""},
		{"read only", 1, claim(modes(rox), nil), "needs ReadWriteMany", ""},
		{"one pod only, many ranks", 2, claim(modes(rwop), nil), "only one pod can mount it and the job runs 2", ""},
		{"one pod only, one rank", 1, claim(modes(rwop), nil), "", ""},
		{"one node only, many nodes", 3, claim(modes(rwo), nil), "", "every rank but one waits in Multi-Attach"},
		{"one node only, one node", 1, claim(modes(rwo, rox), nil), "", ""},
		{"modes unknown", 3, claim(nil, nil), "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(c.nodes).ClaimCheckpoint("ckpt").Obj()
			refused, warn := claimAccess(job, c.claim)
			if (c.refused == "") != (refused == "") || !strings.Contains(refused, c.refused) {
				t.Errorf("refused %q, want %q", refused, c.refused)
			}
			if (c.warn == "") != (warn == "") || !strings.Contains(warn, c.warn) {
				t.Errorf("warning %q, want %q", warn, c.warn)
			}
		})
	}
}

// A job on an existing claim no run could write is refused before its first pod, naming the
// field; one on a ReadWriteOnce claim across nodes runs, with one warning saying why it may stall.
func TestAnExistingClaimsAccessModeIsChecked(t *testing.T) {
	for _, c := range []struct {
		mode corev1.PersistentVolumeAccessMode
		want string
	}{
		{corev1.ReadOnlyMany, "refused"},
		{corev1.ReadWriteOnce, "warned"},
	} {
		t.Run(string(c.mode), func(t *testing.T) {
			job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Defaulted().ClaimCheckpoint("ckpt").Obj()
			claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "ckpt", Namespace: "ns"},
				Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{c.mode}}}
			h := newHarness(t, interceptor.Funcs{}, job, claim)
			h.mustReconcile(t, job)
			got := h.get(t, job)
			created := condition(got, trainingv1alpha1.ConditionCreated)
			ev := strings.Join(h.drainEvents(), "\n")
			switch c.want {
			case "refused":
				if created == nil || created.Status != metav1.ConditionFalse || !strings.Contains(created.Message, "spec.checkpoint.volume.claimName") ||
					!strings.Contains(created.Message, "needs ReadWriteMany") || len(h.pods(t)) != 0 {
					t.Errorf("Created %+v, %d pods: want refused naming spec.checkpoint.volume.claimName, no pods", created, len(h.pods(t)))
				}
			case "warned":
				if created == nil || created.Status != metav1.ConditionTrue || len(h.pods(t)) != 2 {
					t.Errorf("Created %+v, %d pods: want accepted and running", created, len(h.pods(t)))
				}
				if strings.Count(ev, "CheckpointClaimAccessMode") != 1 || !strings.Contains(ev, "Multi-Attach") {
					t.Errorf("events %q: want one CheckpointClaimAccessMode warning", ev)
				}
				h.mustReconcile(t, job)
				if ev := strings.Join(h.drainEvents(), "\n"); strings.Contains(ev, "CheckpointClaimAccessMode") {
					t.Errorf("warned again on the next pass: %q", ev)
				}
			}
		})
	}
}
