package v1alpha1_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	. "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

func TestValidateSpec(t *testing.T) {
	base := func() *testjob.Wrapper {
		return testjob.MakeZayaTrainingJob("j", "ns").ClaimCheckpoint("ckpt").Defaulted()
	}
	cases := []struct {
		name string
		job  *ZayaTrainingJob
		want []string // "type field" of each error, in order
	}{
		{"valid", base().WorkerEnv("NCCL_DEBUG", "INFO").WorkerLimit(corev1.ResourceMemory, "64Gi").Obj(), nil},
		{"gpu limit in template", base().WorkerLimit("amd.com/gpu", "8").Obj(),
			[]string{"FieldValueForbidden spec.template.spec.containers[0].resources.limits[amd.com/gpu]"}},
		{"nic limit in template", base().WorkerLimit("amd.com/nic", "8").Obj(),
			[]string{"FieldValueForbidden spec.template.spec.containers[0].resources.limits[amd.com/nic]"}},
		{"rendezvous env", base().WorkerEnv("WORLD_SIZE", "4").Obj(),
			[]string{"FieldValueForbidden spec.template.spec.containers[0].env[0].name"}},
		{"torchrun env", base().WorkerEnv("PET_NNODES", "4").Obj(),
			[]string{"FieldValueForbidden spec.template.spec.containers[0].env[0].name"}},
		{"contract env", base().WorkerEnv("ZAYA_CHECKPOINT_DIR", "/x").Obj(),
			[]string{"FieldValueForbidden spec.template.spec.containers[0].env[0].name"}},
		{"restart rules of the template's own", func() *ZayaTrainingJob {
			j := base().Obj()
			j.Spec.Template.Spec.Containers = append(j.Spec.Template.Spec.Containers, corev1.Container{Name: "side",
				RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)})
			j.Spec.Template.Spec.Containers[0].RestartPolicyRules = []corev1.ContainerRestartRule{{Action: corev1.ContainerRestartRuleActionRestart}}
			// A sidecar (an init container that restarts Always) is the template's to keep.
			j.Spec.Template.Spec.InitContainers = []corev1.Container{{Name: "proxy", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}}
			return j
		}(), []string{
			"FieldValueForbidden spec.template.spec.containers[0].restartPolicyRules",
			"FieldValueForbidden spec.template.spec.containers[1].restartPolicy",
		}},
		{"reserved volume name", func() *ZayaTrainingJob {
			j := base().Obj()
			j.Spec.Template.Spec.Volumes = []corev1.Volume{{Name: CheckpointVolumeName}}
			return j
		}(), []string{"FieldValueInvalid spec.template.spec.volumes[0].name"}},
		{"mount over checkpoints", func() *ZayaTrainingJob {
			j := base().Obj()
			j.Spec.Template.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "x", MountPath: "/checkpoints/"}}
			return j
		}(), []string{"FieldValueInvalid spec.template.spec.containers[0].volumeMounts[0].mountPath"}},
		{"mount over shm in an init container", func() *ZayaTrainingJob {
			j := base().Obj()
			j.Spec.Template.Spec.InitContainers = []corev1.Container{{Name: "init", VolumeMounts: []corev1.VolumeMount{{Name: "x", MountPath: "/dev/shm"}}}}
			return j
		}(), []string{"FieldValueInvalid spec.template.spec.initContainers[0].volumeMounts[0].mountPath"}},
		{"mount over shm through .. and //", func() *ZayaTrainingJob {
			j := base().Obj()
			j.Spec.Template.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{
				{Name: "x", MountPath: "/data/../dev/shm"}, {Name: "y", MountPath: "/checkpoints//"}, {Name: "z", MountPath: "/checkpoints/keep"},
			}
			return j
		}(), []string{
			"FieldValueInvalid spec.template.spec.containers[0].volumeMounts[0].mountPath",
			"FieldValueInvalid spec.template.spec.containers[0].volumeMounts[1].mountPath",
		}},
		{"envFrom prefixes in the contract's namespace", func() *ZayaTrainingJob {
			j := base().Obj()
			j.Spec.Template.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{Prefix: "ZAYA_"}, {Prefix: "ZA"}, {Prefix: "PET_X"}, {Prefix: "APP_"}, {}}
			return j
		}(), []string{
			"FieldValueForbidden spec.template.spec.containers[0].envFrom[0].prefix",
			"FieldValueForbidden spec.template.spec.containers[0].envFrom[1].prefix",
			"FieldValueForbidden spec.template.spec.containers[0].envFrom[2].prefix",
		}},
		{"network env name not an identifier", func() *ZayaTrainingJob {
			j := base().Obj()
			j.Spec.Network.Env = []corev1.EnvVar{{Name: "NCCL_DEBUG", Value: "INFO"}, {Name: "BAD-NAME", Value: "x"}}
			return j
		}(), []string{"FieldValueInvalid spec.network.env[1].name"}},
		{"errors come in a stable order", base().WorkerLimit("amd.com/nic", "1").WorkerLimit("amd.com/gpu", "1").Obj(),
			[]string{
				"FieldValueForbidden spec.template.spec.containers[0].resources.limits[amd.com/gpu]",
				"FieldValueForbidden spec.template.spec.containers[0].resources.limits[amd.com/nic]",
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got []string
			for _, e := range ValidateSpec(&c.job.Spec) {
				got = append(got, string(e.Type)+" "+e.Field)
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("ValidateSpec() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestIsReservedEnv(t *testing.T) {
	for name, want := range map[string]bool{
		"MASTER_ADDR": true, "NODE_RANK": true, "PET_MASTER_PORT": true, "ZAYA_JOB_NAME": true,
		"NCCL_IB_HCA": false, "HSA_NO_SCRATCH_RECLAIM": false, "RANKS": false, "MY_ZAYA_X": false,
	} {
		if got := IsReservedEnv(name); got != want {
			t.Errorf("IsReservedEnv(%q) = %v, want %v", name, got, want)
		}
	}
}
