package testjob

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// Source picks numbers: *math/rand/v2.Rand for seeded property tests, Bytes for go fuzzing.
type Source interface {
	IntN(n int) int
}

// Bytes is a Source that reads its choices from fuzz input (0 once it runs out).
type Bytes struct{ Data []byte }

// IntN returns the next choice below n.
func (b *Bytes) IntN(n int) int {
	if n <= 1 || len(b.Data) == 0 {
		return 0
	}
	v := int(b.Data[0])
	b.Data = b.Data[1:]
	if n > 256 && len(b.Data) > 0 {
		v = v<<8 | int(b.Data[0])
		b.Data = b.Data[1:]
	}
	return v % n
}

func pick[T any](s Source, vs ...T) T { return vs[s.IntN(len(vs))] }

// vary is usually valid, one time in 20 one of the hostile values, so that a fair share of
// random jobs passes every rule and the rest break one or two.
func vary[T any](s Source, valid T, hostile ...T) T {
	if s.IntN(20) != 0 {
		return valid
	}
	return pick(s, hostile...)
}

func maybe[T any](s Source, v T) *T {
	if s.IntN(3) == 0 {
		return nil
	}
	return &v
}

// Random builds a job from s, mixing valid values with edge and hostile ones (zero and
// negative counts, huge sizes, bad names, reserved and injected variables, long strings), the
// way users and scripts get them wrong. Many results are invalid on purpose.
func Random(s Source, name, ns string) *trainingv1alpha1.ZayaTrainingJob {
	long := strings.Repeat("x", pick(s, 64, 1024, 1<<20))
	job := MakeZayaTrainingJob(vary(s, pick(s, name, name+"-"+strings.Repeat("a", 44)), name+"-"+strings.Repeat("a", 50), "Upper", "9lives"), ns).Obj()
	spec := &job.Spec
	spec.Nodes = vary(s, pick[int32](s, 1, 2, 3, 8, 128, 2048, 4096), 0, -1, 5000)
	spec.GPUsPerNode = vary(s, pick[int32](s, 0, 1, 2, 4, 8), 9, -8)
	gpus := spec.GPUsPerNode
	if gpus <= 0 {
		gpus = 8
	}
	cp := pick[int32](s, 0, 1, 1, 2, 4, 8, 16)
	if cp > 0 && (spec.Nodes*gpus)%cp != 0 {
		cp = 1
	}
	spec.Parallelism.ContextParallel = vary(s, cp, 3, 5, 32768, 40000)
	spec.Network.Profile = vary(s, pick(s, "", trainingv1alpha1.NetworkPollaraAINIC, trainingv1alpha1.NetworkRoCE, trainingv1alpha1.NetworkSocket), "Infiniband")
	rdma := spec.Network.Profile != trainingv1alpha1.NetworkSocket
	if rdma {
		spec.Network.NICsPerNode = maybe(s, vary(s, pick[int32](s, 0, 1, 2, 8), 9, -1))
	} else {
		spec.Network.NICsPerNode = maybe(s, vary[int32](s, 0, 2))
	}
	if s.IntN(3) == 0 && (rdma || s.IntN(20) == 0) {
		spec.Network.HCAs = []string{vary(s, pick(s, "ionic_0", "mlx5_1"), "", "a b", "ionic_0,ionic_1", long)}
	}
	spec.Network.SocketIfname = vary(s, pick(s, "", "eth0", "ib0"), "=eth0", "^lo,docker", "eth0;rm -rf /", long)
	if s.IntN(2) == 0 {
		spec.Network.CollectiveTimeout = &metav1.Duration{Duration: vary(s, pick(s, time.Minute, 90*time.Minute+500*time.Millisecond), time.Second, 0, -time.Minute, 1000*time.Hour)}
	}
	for i := range s.IntN(4) {
		spec.Network.Env = append(spec.Network.Env, corev1.EnvVar{
			Name:  vary(s, []string{"NCCL_DEBUG", "NCCL_IB_HCA", "FOO"}[i%3], "MASTER_ADDR", "ZAYA_RANK", "PET_NNODES", "1BAD", "A-B", "", long),
			Value: pick(s, "INFO", "", "$(MASTER_ADDR)", "$(ZAYA_CHECKPOINT_DIR)/../../etc", "x\ny", long),
		})
	}
	switch s.IntN(4) {
	case 1:
		spec.Checkpoint = &trainingv1alpha1.CheckpointSpec{Volume: trainingv1alpha1.CheckpointVolume{
			Size: ptr.To(resource.MustParse(vary(s, pick(s, "10Gi", "1", "10Ti"), "0", "-1Gi", "8Ei"))),
		}}
		if s.IntN(2) == 0 {
			spec.Checkpoint.Volume.StorageClassName = ptr.To(vary(s, "ibmc-vpc-file-3000-iops", "", "Bad_Class"))
		}
		if s.IntN(2) == 0 {
			spec.Checkpoint.Volume.AccessModes = []corev1.PersistentVolumeAccessMode{vary(s, pick(s, corev1.ReadWriteMany, corev1.ReadWriteOnce), "Sometimes")}
		}
	case 2:
		spec.Checkpoint = &trainingv1alpha1.CheckpointSpec{Volume: trainingv1alpha1.CheckpointVolume{
			ClaimName: vary(s, pick(s, "ckpt", "a.b"), "Bad_Name", long),
		}}
		if s.IntN(12) == 0 {
			spec.Checkpoint.Volume.Size = ptr.To(resource.MustParse("1Gi")) // both: one-of broken
		}
	case 3:
		if s.IntN(6) == 0 {
			spec.Checkpoint = &trainingv1alpha1.CheckpointSpec{} // no volume
		}
	}
	if c := spec.Checkpoint; c != nil {
		c.MountPath = vary(s, pick(s, "", "/checkpoints"), "relative", "/dev/shm", "/", "/ckpt/../etc")
		c.Keep = vary(s, pick[int32](s, 0, 1, 3), -1, 1000)
		switch s.IntN(4) {
		case 1:
			c.Interval = &trainingv1alpha1.CheckpointInterval{Steps: ptr.To(vary(s, pick[int32](s, 1, 50), 0, -5))}
		case 2:
			c.Interval = &trainingv1alpha1.CheckpointInterval{Duration: &metav1.Duration{Duration: vary(s, pick(s, 30*time.Minute, time.Second), 0)}}
		case 3:
			if s.IntN(6) != 0 {
				break
			}
			c.Interval = &trainingv1alpha1.CheckpointInterval{Steps: ptr.To[int32](10), Duration: &metav1.Duration{Duration: time.Minute}}
		}
	}
	ft := &spec.FaultTolerance
	ft.MaxRestarts = maybe(s, vary(s, pick[int32](s, 0, 3, 20), -1, 1<<30))
	if s.IntN(2) == 0 {
		ft.HangTimeout = &metav1.Duration{Duration: vary(s, pick(s, 30*time.Second, 20*time.Minute), 10*time.Second, 0)}
	}
	if s.IntN(3) == 0 {
		ft.ExitCodes.Fatal = []int32{vary(s, pick[int32](s, 78, 1), 0, 256, -1)}
		ft.ExitCodes.Retryable = []int32{vary(s, 137, ft.ExitCodes.Fatal[0])}
	}
	ft.Quarantine.NodeTaint = vary(s, pick(s, "", trainingv1alpha1.QuarantineTaintNone, trainingv1alpha1.QuarantineTaintNoSchedule), "Evict")
	spec.Placement.NodeSharing = vary(s, pick(s, "", trainingv1alpha1.NodeSharingExclusive, trainingv1alpha1.NodeSharingShared), "Packed")
	spec.Placement.GPUNodeSelector = pick(s, "", trainingv1alpha1.GPUNodeSelectorNone, trainingv1alpha1.GPUNodeSelectorNFD)
	spec.SuccessPolicy = vary(s, pick(s, "", trainingv1alpha1.SuccessRank0, trainingv1alpha1.SuccessAllRanks), "Majority")
	spec.TTLSecondsAfterFinished = maybe(s, vary(s, pick[int32](s, 0, 60), -1))
	spec.ActiveDeadlineSeconds = maybe(s, vary(s, pick[int64](s, 1, 3600), 0))

	pod := &spec.Template.Spec
	c := &pod.Containers[0]
	c.Name = vary(s, pick(s, "worker", "trainer"), "Worker")
	for range s.IntN(3) {
		c.Env = append(c.Env, corev1.EnvVar{
			Name:  vary(s, pick(s, "HF_HOME", "NCCL_DEBUG", "LD_PRELOAD"), "WORLD_SIZE", "ZAYA_CHECKPOINT_DIR"),
			Value: pick(s, "/data", "$(RANK)", "/tmp/evil.so", long),
		})
	}
	if s.IntN(12) == 0 {
		c.Resources.Limits = corev1.ResourceList{corev1.ResourceName(pick(s, "amd.com/gpu", "cpu", "amd.com/nic")): resource.MustParse(pick(s, "8", "1", "0"))}
	}
	if s.IntN(4) == 0 {
		pod.Volumes = append(pod.Volumes, corev1.Volume{Name: vary(s, "data", trainingv1alpha1.CheckpointVolumeName, trainingv1alpha1.ShmVolumeName),
			VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: pod.Volumes[0].Name, MountPath: vary(s, "/data", "/dev/shm", "/checkpoints")})
	}
	if s.IntN(5) == 0 {
		pod.Containers = append(pod.Containers, corev1.Container{Name: vary(s, "sidecar", c.Name), Image: "busybox"})
	}
	if s.IntN(12) == 0 {
		pod.Hostname = pick(s, "fixed", long)
	}
	if s.IntN(5) == 0 {
		pod.RestartPolicy = vary(s, corev1.RestartPolicyNever, corev1.RestartPolicyAlways, corev1.RestartPolicyOnFailure)
	}
	if s.IntN(4) == 0 {
		pod.NodeSelector = map[string]string{vary(s, "ibm-cloud.kubernetes.io/worker-pool-name", "bad key!"): vary(s, "mi300x", long)}
	}
	job.Labels = map[string]string{"team": fmt.Sprint(s.IntN(10))}
	return job
}
