// Package testjob builds ZayaTrainingJobs for tests: MakeZayaTrainingJob(name, ns).Nodes(4).Obj().
package testjob

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// Wrapper builds a ZayaTrainingJob.
type Wrapper struct {
	trainingv1alpha1.ZayaTrainingJob
}

// MakeZayaTrainingJob is a 2-node job of one worker container with nothing defaulted.
func MakeZayaTrainingJob(name, ns string) *Wrapper {
	return &Wrapper{trainingv1alpha1.ZayaTrainingJob{
		TypeMeta:   metav1.TypeMeta{APIVersion: trainingv1alpha1.GroupVersion.String(), Kind: "ZayaTrainingJob"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: trainingv1alpha1.ZayaTrainingJobSpec{
			Nodes: 2,
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "worker", Image: "zaya-worker:test"}},
			}},
		},
	}}
}

// Obj returns the built job.
func (w *Wrapper) Obj() *trainingv1alpha1.ZayaTrainingJob { return &w.ZayaTrainingJob }

// Defaulted applies the CRD defaults, as the apiserver would.
func (w *Wrapper) Defaulted() *Wrapper { w.Default(); return w }

// Nodes sets spec.nodes.
func (w *Wrapper) Nodes(n int32) *Wrapper { w.Spec.Nodes = n; return w }

// GPUsPerNode sets spec.gpusPerNode.
func (w *Wrapper) GPUsPerNode(n int32) *Wrapper { w.Spec.GPUsPerNode = n; return w }

// ContextParallel sets spec.parallelism.contextParallel.
func (w *Wrapper) ContextParallel(n int32) *Wrapper { w.Spec.Parallelism.ContextParallel = n; return w }

// Profile sets spec.network.profile.
func (w *Wrapper) Profile(p trainingv1alpha1.NetworkProfile) *Wrapper {
	w.Spec.Network.Profile = p
	return w
}

// NICsPerNode sets spec.network.nicsPerNode.
func (w *Wrapper) NICsPerNode(n int32) *Wrapper { w.Spec.Network.NICsPerNode = ptr.To(n); return w }

// ClaimCheckpoint keeps checkpoints on an existing claim.
func (w *Wrapper) ClaimCheckpoint(claim string) *Wrapper {
	w.Spec.Checkpoint = &trainingv1alpha1.CheckpointSpec{Volume: trainingv1alpha1.CheckpointVolume{ClaimName: claim}}
	return w
}

// NewCheckpoint keeps checkpoints on a claim the operator creates.
func (w *Wrapper) NewCheckpoint(size, class string) *Wrapper {
	v := trainingv1alpha1.CheckpointVolume{Size: ptr.To(resource.MustParse(size))}
	if class != "" {
		v.StorageClassName = ptr.To(class)
	}
	w.Spec.Checkpoint = &trainingv1alpha1.CheckpointSpec{Volume: v}
	return w
}

// Elastic sets spec.elastic with minNodes, shrinkAfter and growAfter.
func (w *Wrapper) Elastic(minNodes int32, shrinkAfter, growAfter time.Duration) *Wrapper {
	w.Spec.Elastic = &trainingv1alpha1.ElasticSpec{MinNodes: minNodes,
		ShrinkAfter: &metav1.Duration{Duration: shrinkAfter}, GrowAfter: &metav1.Duration{Duration: growAfter}}
	return w
}

// Suspend sets spec.suspend.
func (w *Wrapper) Suspend(s bool) *Wrapper { w.Spec.Suspend = s; return w }

// ManagedBy sets spec.managedBy.
func (w *Wrapper) ManagedBy(m string) *Wrapper { w.Spec.ManagedBy = ptr.To(m); return w }

// Label sets a label on the job.
func (w *Wrapper) Label(k, v string) *Wrapper {
	if w.Labels == nil {
		w.Labels = map[string]string{}
	}
	w.Labels[k] = v
	return w
}

// Annotation sets an annotation on the job.
func (w *Wrapper) Annotation(k, v string) *Wrapper {
	if w.Annotations == nil {
		w.Annotations = map[string]string{}
	}
	w.Annotations[k] = v
	return w
}

// RestartMode sets spec.faultTolerance.restartMode.
func (w *Wrapper) RestartMode(m trainingv1alpha1.RestartMode) *Wrapper {
	w.Spec.FaultTolerance.RestartMode = m
	return w
}

// Generation sets metadata.generation.
func (w *Wrapper) Generation(g int64) *Wrapper { w.ObjectMeta.Generation = g; return w }

// WorkerEnv adds an environment variable to the first container.
func (w *Wrapper) WorkerEnv(name, value string) *Wrapper {
	c := &w.Spec.Template.Spec.Containers[0]
	c.Env = append(c.Env, corev1.EnvVar{Name: name, Value: value})
	return w
}

// WorkerLimit adds a resource limit to the first container.
func (w *Wrapper) WorkerLimit(name corev1.ResourceName, q string) *Wrapper {
	c := &w.Spec.Template.Spec.Containers[0]
	if c.Resources.Limits == nil {
		c.Resources.Limits = corev1.ResourceList{}
	}
	c.Resources.Limits[name] = resource.MustParse(q)
	return w
}

// WorkerCommand sets the first container's command and arguments.
func (w *Wrapper) WorkerCommand(command []string, args ...string) *Wrapper {
	c := &w.Spec.Template.Spec.Containers[0]
	c.Command, c.Args = command, args
	return w
}

// HealthyNode is a Ready MI300X node, all 8 of its GPUs and NICs allocatable.
func HealthyNode(name string) *corev1.Node {
	res := corev1.ResourceList{"amd.com/gpu": resource.MustParse("8"), "amd.com/nic": resource.MustParse("8")}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{
			Capacity: res, Allocatable: res.DeepCopy(),
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}
}
