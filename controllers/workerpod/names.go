package workerpod

import (
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// JobKind is the kind whose controller references mark the operator's children.
const JobKind = "ZayaTrainingJob"

// PodName is the name of rank's pod in attempt. Worker pods carry the attempt so a restarted
// gang never collides with the pods of the attempt it replaces; hostnames do not, so rank r
// is always <job>-<r>.<job>.<ns>.svc.
func PodName(job *trainingv1alpha1.ZayaTrainingJob, attempt, rank int32) string {
	return fmt.Sprintf("%s-%d-%d", job.Name, attempt, rank)
}

// Hostname is rank's hostname, the same in every attempt.
func Hostname(job *trainingv1alpha1.ZayaTrainingJob, rank int32) string {
	return fmt.Sprintf("%s-%d", job.Name, rank)
}

// ClaimName is the checkpoint claim the job's pods mount: the user's, else the operator's.
func ClaimName(job *trainingv1alpha1.ZayaTrainingJob) string {
	if c := job.Spec.Checkpoint; c != nil && c.Volume.ClaimName != "" {
		return c.Volume.ClaimName
	}
	return job.Name + "-checkpoints"
}

// MasterAddr is rank 0's DNS name through the job's headless Service.
func MasterAddr(job *trainingv1alpha1.ZayaTrainingJob) string {
	return fmt.Sprintf("%s.%s.%s.svc", Hostname(job, 0), job.Name, job.Namespace)
}

// OwnerRef is the controller reference that marks the job's children.
func OwnerRef(job *trainingv1alpha1.ZayaTrainingJob) metav1.OwnerReference {
	return *metav1.NewControllerRef(job, trainingv1alpha1.GroupVersion.WithKind(JobKind))
}

// OwningJob is the name of the ZayaTrainingJob that controls obj, if one does.
func OwningJob(obj metav1.Object) (string, bool) {
	ref := metav1.GetControllerOf(obj)
	if ref == nil || ref.Kind != JobKind || ref.APIVersion != trainingv1alpha1.GroupVersion.String() {
		return "", false
	}
	return ref.Name, true
}

// OwnerIndex is the field index of objects (pods, Workloads) by the name of the job that
// controls them.
const OwnerIndex = ".metadata.controller.zayatrainingjob"

// JobLabels are the labels of every object the job owns.
func JobLabels(job *trainingv1alpha1.ZayaTrainingJob) map[string]string {
	return map[string]string{trainingv1alpha1.JobNameLabel: job.Name}
}

// Service is the headless Service whose DNS records let ranks find each other, ready or not.
func Service(job *trainingv1alpha1.ZayaTrainingJob) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name: job.Name, Namespace: job.Namespace, Labels: JobLabels(job),
			OwnerReferences: []metav1.OwnerReference{OwnerRef(job)},
		},
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone,
			// Ranks only: spares carry the job's name too, and are no peers.
			Selector:                 map[string]string{trainingv1alpha1.JobNameLabel: job.Name, trainingv1alpha1.RoleLabel: trainingv1alpha1.RoleRank},
			PublishNotReadyAddresses: true,
			Ports: []corev1.ServicePort{{
				Name: "rendezvous", Port: trainingv1alpha1.MasterPort,
				TargetPort: intstr.FromInt32(trainingv1alpha1.MasterPort), Protocol: corev1.ProtocolTCP,
			}},
		},
	}
}

// CheckpointClaim is the claim the operator creates for spec.checkpoint.volume.size, or nil
// when the job uses an existing claim or no checkpoints. It is owned by the job (and so
// deleted with it) only when retainOnDelete is false.
func CheckpointClaim(job *trainingv1alpha1.ZayaTrainingJob) *corev1.PersistentVolumeClaim {
	c := job.Spec.Checkpoint
	if c == nil || c.Volume.Size == nil {
		return nil
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: ClaimName(job), Namespace: job.Namespace, Labels: JobLabels(job)},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      c.Volume.CheckpointAccessModes(),
			StorageClassName: c.Volume.StorageClassName,
			Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: *c.Volume.Size},
			},
		},
	}
	if c.RetainOnDelete != nil && !*c.RetainOnDelete {
		pvc.OwnerReferences = []metav1.OwnerReference{OwnerRef(job)}
	}
	return pvc
}

// RankLabels are the labels by which the operator finds the pod of rank in attempt.
func RankLabels(job *trainingv1alpha1.ZayaTrainingJob, attempt, rank int32) map[string]string {
	return map[string]string{
		trainingv1alpha1.JobNameLabel: job.Name,
		trainingv1alpha1.RoleLabel:    trainingv1alpha1.RoleRank,
		trainingv1alpha1.RankLabel:    strconv.FormatInt(int64(rank), 10),
		trainingv1alpha1.AttemptLabel: strconv.FormatInt(int64(attempt), 10),
	}
}
