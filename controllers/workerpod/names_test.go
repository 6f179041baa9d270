package workerpod

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

func TestNewService(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "team").Obj()
	got := Service(job)
	want := corev1.ServiceSpec{
		ClusterIP: "None", Selector: map[string]string{"training.zaya.dev/job-name": "llm", "training.zaya.dev/role": "rank"}, PublishNotReadyAddresses: true,
		Ports: []corev1.ServicePort{{Name: "rendezvous", Port: 29500, TargetPort: intstr.FromInt32(29500), Protocol: corev1.ProtocolTCP}},
	}
	if diff := cmp.Diff(want, got.Spec); diff != "" {
		t.Errorf("service spec (-want +got):\n%s", diff)
	}
	if got.Name != "llm" || got.Namespace != "team" || len(got.OwnerReferences) != 1 {
		t.Errorf("service meta = %+v", got.ObjectMeta)
	}
}

func TestNewCheckpointClaim(t *testing.T) {
	if c := CheckpointClaim(testjob.MakeZayaTrainingJob("j", "ns").Defaulted().Obj()); c != nil {
		t.Errorf("claim without checkpoint: %+v", c)
	}
	if c := CheckpointClaim(testjob.MakeZayaTrainingJob("j", "ns").ClaimCheckpoint("mine").Defaulted().Obj()); c != nil {
		t.Errorf("claim for an existing claim: %+v", c)
	}

	retained := CheckpointClaim(testjob.MakeZayaTrainingJob("j", "ns").NewCheckpoint("10Ti", "ibmc-vpc-file-3000-iops").Defaulted().Obj())
	want := corev1.PersistentVolumeClaimSpec{
		AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
		StorageClassName: ptr.To("ibmc-vpc-file-3000-iops"),
		Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: qty("10Ti")}},
	}
	if diff := cmp.Diff(want, retained.Spec); diff != "" {
		t.Errorf("claim spec (-want +got):\n%s", diff)
	}
	if retained.Name != "j-checkpoints" || len(retained.OwnerReferences) != 0 {
		t.Errorf("retained claim: name %q, owners %v (want none: it outlives the job)", retained.Name, retained.OwnerReferences)
	}

	owned := testjob.MakeZayaTrainingJob("j", "ns").NewCheckpoint("1Gi", "").Defaulted().Obj()
	owned.Spec.Checkpoint.RetainOnDelete = ptr.To(false)
	if c := CheckpointClaim(owned); len(c.OwnerReferences) != 1 || c.Spec.StorageClassName != nil {
		t.Errorf("unretained claim: owners %v, class %v", c.OwnerReferences, c.Spec.StorageClassName)
	}
}
