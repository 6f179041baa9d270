package controllers

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

func env(kv ...string) []corev1.EnvVar {
	out := make([]corev1.EnvVar, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, corev1.EnvVar{Name: kv[i], Value: kv[i+1]})
	}
	return out
}

func envMap(list []corev1.EnvVar) map[string]string {
	m := map[string]string{}
	for _, e := range list {
		if _, dup := m[e.Name]; dup {
			m[e.Name] = "DUPLICATE"
			continue
		}
		m[e.Name] = e.Value
	}
	return m
}

func qty(s string) resource.Quantity { return resource.MustParse(s) }

func TestNewWorkerPodWholeObject(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "team").Nodes(2).Profile(trainingv1alpha1.NetworkSocket).
		ClaimCheckpoint("ckpt").Defaulted().Obj()
	job.UID = "uid-1"
	job.Status.Restarts = 3
	job.Spec.Checkpoint.Interval = &trainingv1alpha1.CheckpointInterval{Steps: ptr.To[int32](50)}
	job.Spec.Template.Labels = map[string]string{"team": "llm"}
	job.Spec.Template.Spec.Containers[0].Env = env("NCCL_DEBUG", "INFO", "MY_RANK", "$(NODE_RANK)")

	network := networkEnv(&job.Spec)
	got := newWorkerPod(job, network, 1)

	contract := env(
		"MASTER_ADDR", "llm-0.llm.team.svc", "MASTER_PORT", "29500", "WORLD_SIZE", "16", "NNODES", "2",
		"NODE_RANK", "1", "GPUS_PER_NODE", "8", "LOCAL_WORLD_SIZE", "8",
		"PET_NNODES", "2", "PET_NODE_RANK", "1", "PET_NPROC_PER_NODE", "8",
		"PET_MASTER_ADDR", "llm-0.llm.team.svc", "PET_MASTER_PORT", "29500",
		"ZAYA_JOB_NAME", "llm", "ZAYA_RESTART_ATTEMPT", "3", "ZAYA_CONTEXT_PARALLEL", "1",
		"ZAYA_HEARTBEAT_FILE", "/dev/shm/zaya-heartbeat",
		"ZAYA_CHECKPOINT_DIR", "/checkpoints", "ZAYA_CHECKPOINT_INTERVAL", "50", "ZAYA_CHECKPOINT_KEEP", "3",
		"ZAYA_TERMINATION_LOG", "/dev/termination-log",
	)
	wantEnv := append(append(contract, network...), env("NCCL_DEBUG", "INFO", "MY_RANK", "$(NODE_RANK)")...)
	want := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "llm-3-1", Namespace: "team",
			Labels: map[string]string{
				"team": "llm", "training.zaya.dev/job-name": "llm", "training.zaya.dev/rank": "1", "training.zaya.dev/attempt": "3",
			},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "training.zaya.dev/v1alpha1", Kind: "ZayaTrainingJob", Name: "llm", UID: "uid-1",
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			Hostname:                     "llm-1",
			Subdomain:                    "llm",
			AutomountServiceAccountToken: ptr.To(false),
			Volumes: []corev1.Volume{
				{Name: "zaya-shm", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}},
				{Name: "zaya-checkpoints", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "ckpt"}}},
			},
			Containers: []corev1.Container{{
				Name: "worker", Image: "zaya-worker:test",
				Env: wantEnv,
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{"amd.com/gpu": qty("8")},
					Limits:   corev1.ResourceList{"amd.com/gpu": qty("8")},
				},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "zaya-shm", MountPath: "/dev/shm"},
					{Name: "zaya-checkpoints", MountPath: "/checkpoints"},
				},
				LivenessProbe: &corev1.Probe{
					ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c",
						`f="$ZAYA_HEARTBEAT_FILE"; [ -f "$f" ] && [ $(( $(date +%s) - $(stat -c %Y "$f") )) -lt 1800 ] || ` +
							`{ echo "zaya: hang: no heartbeat for 1800s" >> /dev/termination-log; exit 1; }`}}},
					InitialDelaySeconds: 1800, PeriodSeconds: 60, TimeoutSeconds: 10, FailureThreshold: 1,
				},
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false)},
			}},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("newWorkerPod (-want +got):\n%s", diff)
	}
	if job.Spec.Template.Spec.Containers[0].Resources.Limits != nil || len(job.Spec.Template.Spec.Volumes) != 0 {
		t.Error("newWorkerPod changed the job's template")
	}
}

func TestNewWorkerPodVariants(t *testing.T) {
	cases := []struct {
		name  string
		job   *trainingv1alpha1.ZayaTrainingJob
		check func(t *testing.T, p *corev1.Pod)
	}{
		{"pollara: GPUs, NICs and IPC_LOCK on the worker container", testjob.MakeZayaTrainingJob("j", "ns").Defaulted().Obj(),
			func(t *testing.T, p *corev1.Pod) {
				r := p.Spec.Containers[0].Resources
				if diff := cmp.Diff(corev1.ResourceList{"amd.com/gpu": qty("8"), "amd.com/nic": qty("8")}, r.Limits); diff != "" {
					t.Errorf("limits (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(r.Limits, r.Requests); diff != "" {
					t.Errorf("requests differ from limits:\n%s", diff)
				}
				if diff := cmp.Diff([]corev1.Capability{"IPC_LOCK"}, p.Spec.Containers[0].SecurityContext.Capabilities.Add); diff != "" {
					t.Errorf("capabilities (-want +got):\n%s", diff)
				}
				if p.Spec.Containers[0].SecurityContext.Privileged != nil {
					t.Error("worker must not be privileged")
				}
			}},
		{"socket: no NICs, no capabilities", testjob.MakeZayaTrainingJob("j", "ns").Profile(trainingv1alpha1.NetworkSocket).Defaulted().Obj(),
			func(t *testing.T, p *corev1.Pod) {
				if _, ok := p.Spec.Containers[0].Resources.Limits["amd.com/nic"]; ok {
					t.Error("socket profile requested amd.com/nic")
				}
				if sc := p.Spec.Containers[0].SecurityContext; sc.Capabilities != nil {
					t.Errorf("socket profile added capabilities: %+v", sc.Capabilities)
				}
			}},
		{"roce with explicit NICs", testjob.MakeZayaTrainingJob("j", "ns").Profile(trainingv1alpha1.NetworkRoCE).NICsPerNode(4).Defaulted().Obj(),
			func(t *testing.T, p *corev1.Pod) {
				if got := p.Spec.Containers[0].Resources.Limits["amd.com/nic"]; got.Cmp(qty("4")) != 0 {
					t.Errorf("amd.com/nic = %v, want 4", got.String())
				}
			}},
		{"gpus go to the container named worker, env to every container", func() *trainingv1alpha1.ZayaTrainingJob {
			j := testjob.MakeZayaTrainingJob("j", "ns").Defaulted().Obj()
			j.Spec.Template.Spec.Containers = []corev1.Container{{Name: "sidecar"}, {Name: "worker"}}
			j.Spec.Template.Spec.InitContainers = []corev1.Container{{Name: "fetch-data"}}
			return j
		}(), func(t *testing.T, p *corev1.Pod) {
			if _, ok := p.Spec.Containers[0].Resources.Limits["amd.com/gpu"]; ok {
				t.Error("the sidecar got the GPUs")
			}
			if _, ok := p.Spec.Containers[1].Resources.Limits["amd.com/gpu"]; !ok {
				t.Error("the worker container has no GPUs")
			}
			for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
				if envMap(c.Env)["NODE_RANK"] != "0" {
					t.Errorf("container %s has no NODE_RANK", c.Name)
				}
			}
		}},
		{"exclusive nodes with fewer than 8 GPUs: anti-affinity next to the template's", func() *trainingv1alpha1.ZayaTrainingJob {
			j := testjob.MakeZayaTrainingJob("j", "ns").GPUsPerNode(4).Defaulted().Obj()
			j.Spec.Template.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{}}
			return j
		}(), func(t *testing.T, p *corev1.Pod) {
			a := p.Spec.Affinity
			if a.NodeAffinity == nil {
				t.Error("the template's node affinity was dropped")
			}
			want := []corev1.PodAffinityTerm{{
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"training.zaya.dev/job-name": "j"}},
				TopologyKey:   "kubernetes.io/hostname",
			}}
			if diff := cmp.Diff(want, a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution); diff != "" {
				t.Errorf("anti-affinity (-want +got):\n%s", diff)
			}
		}},
		{"shared nodes: no anti-affinity", func() *trainingv1alpha1.ZayaTrainingJob {
			j := testjob.MakeZayaTrainingJob("j", "ns").GPUsPerNode(2).Defaulted().Obj()
			j.Spec.Placement.NodeSharing = trainingv1alpha1.NodeSharingShared
			return j
		}(), func(t *testing.T, p *corev1.Pod) {
			if p.Spec.Affinity != nil {
				t.Errorf("affinity = %+v, want none", p.Spec.Affinity)
			}
		}},
		{"8 GPUs fill a node: no anti-affinity needed", testjob.MakeZayaTrainingJob("j", "ns").Defaulted().Obj(),
			func(t *testing.T, p *corev1.Pod) {
				if p.Spec.Affinity != nil {
					t.Errorf("affinity = %+v, want none", p.Spec.Affinity)
				}
			}},
		{"NFD node selector next to the template's", func() *trainingv1alpha1.ZayaTrainingJob {
			j := testjob.MakeZayaTrainingJob("j", "ns").Defaulted().Obj()
			j.Spec.Placement.GPUNodeSelector = trainingv1alpha1.GPUNodeSelectorNFD
			j.Spec.Template.Spec.NodeSelector = map[string]string{"ibm-cloud.kubernetes.io/worker-pool-name": "mi300x"}
			return j
		}(), func(t *testing.T, p *corev1.Pod) {
			want := map[string]string{"ibm-cloud.kubernetes.io/worker-pool-name": "mi300x", "feature.node.kubernetes.io/amd-gpu": "true"}
			if diff := cmp.Diff(want, p.Spec.NodeSelector); diff != "" {
				t.Errorf("nodeSelector (-want +got):\n%s", diff)
			}
		}},
		{"the template may ask for a service-account token", func() *trainingv1alpha1.ZayaTrainingJob {
			j := testjob.MakeZayaTrainingJob("j", "ns").Defaulted().Obj()
			j.Spec.Template.Spec.AutomountServiceAccountToken = ptr.To(true)
			return j
		}(), func(t *testing.T, p *corev1.Pod) {
			if !*p.Spec.AutomountServiceAccountToken {
				t.Error("the template's automountServiceAccountToken: true was overridden")
			}
		}},
		{"scheduling fields of the template survive", func() *trainingv1alpha1.ZayaTrainingJob {
			j := testjob.MakeZayaTrainingJob("j", "ns").Defaulted().Obj()
			j.Spec.Template.Spec.SchedulerName = "volcano"
			j.Spec.Template.Spec.PriorityClassName = "training-high"
			j.Spec.Template.Spec.Tolerations = []corev1.Toleration{{Key: "amd.com/gpu", Operator: corev1.TolerationOpExists}}
			return j
		}(), func(t *testing.T, p *corev1.Pod) {
			if p.Spec.SchedulerName != "volcano" || p.Spec.PriorityClassName != "training-high" || len(p.Spec.Tolerations) != 1 {
				t.Errorf("lost scheduling fields: %q %q %v", p.Spec.SchedulerName, p.Spec.PriorityClassName, p.Spec.Tolerations)
			}
		}},
		{"the template's own liveness probe is kept", func() *trainingv1alpha1.ZayaTrainingJob {
			j := testjob.MakeZayaTrainingJob("j", "ns").Defaulted().Obj()
			j.Spec.Template.Spec.Containers[0].LivenessProbe = &corev1.Probe{PeriodSeconds: 7}
			return j
		}(), func(t *testing.T, p *corev1.Pod) {
			if p.Spec.Containers[0].LivenessProbe.PeriodSeconds != 7 {
				t.Errorf("liveness probe replaced: %+v", p.Spec.Containers[0].LivenessProbe)
			}
		}},
		{"a short hang timeout probes often", func() *trainingv1alpha1.ZayaTrainingJob {
			j := testjob.MakeZayaTrainingJob("j", "ns").Defaulted().Obj()
			j.Spec.FaultTolerance.HangTimeout = &metav1.Duration{Duration: 45e9}
			return j
		}(), func(t *testing.T, p *corev1.Pod) {
			pr := p.Spec.Containers[0].LivenessProbe
			if pr.InitialDelaySeconds != 45 || pr.PeriodSeconds != 10 {
				t.Errorf("probe = delay %d period %d, want 45 and 10", pr.InitialDelaySeconds, pr.PeriodSeconds)
			}
		}},
		{"no checkpoint: no volume, no checkpoint env", testjob.MakeZayaTrainingJob("j", "ns").Defaulted().Obj(),
			func(t *testing.T, p *corev1.Pod) {
				if len(p.Spec.Volumes) != 1 || p.Spec.Volumes[0].Name != "zaya-shm" {
					t.Errorf("volumes = %v, want only zaya-shm", p.Spec.Volumes)
				}
				if _, ok := envMap(p.Spec.Containers[0].Env)["ZAYA_CHECKPOINT_DIR"]; ok {
					t.Error("ZAYA_CHECKPOINT_DIR set without a checkpoint")
				}
			}},
		{"created volume: duration interval, claim named after the job", testjob.MakeZayaTrainingJob("j", "ns").NewCheckpoint("1Ti", "").Defaulted().Obj(),
			func(t *testing.T, p *corev1.Pod) {
				if got := p.Spec.Volumes[1].PersistentVolumeClaim.ClaimName; got != "j-checkpoints" {
					t.Errorf("claim = %q, want j-checkpoints", got)
				}
				if got := envMap(p.Spec.Containers[0].Env)["ZAYA_CHECKPOINT_INTERVAL"]; got != "30m0s" {
					t.Errorf("ZAYA_CHECKPOINT_INTERVAL = %q, want 30m0s", got)
				}
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newWorkerPod(c.job, networkEnv(&c.job.Spec), 0)
			for _, ct := range append(p.Spec.InitContainers, p.Spec.Containers...) {
				for name, v := range envMap(ct.Env) {
					if v == "DUPLICATE" {
						t.Errorf("container %s has %s twice", ct.Name, name)
					}
				}
			}
			c.check(t, p)
		})
	}
}

func TestNetworkEnvPerProfile(t *testing.T) {
	pollara := map[string]string{
		"NCCL_IB_HCA":    "ionic_0,ionic_1,ionic_2,ionic_3,ionic_4,ionic_5,ionic_6,ionic_7",
		"NCCL_CROSS_NIC": "0", "NCCL_IB_GID_INDEX": "1", "NCCL_IB_ROCE_VERSION_NUM": "2",
		"NCCL_IB_TC": "104", "NCCL_IB_FIFO_TC": "192", "NCCL_IB_TIMEOUT": "22", "NCCL_IB_RETRY_CNT": "12",
		"NCCL_IB_QPS_PER_CONNECTION": "1", "NCCL_IB_USE_INLINE": "1", "NCCL_GDR_FLUSH_DISABLE": "1",
		"NCCL_DMABUF_ENABLE": "0", "NCCL_NET_PLUGIN": "librccl-anp.so", "NCCL_PXN_DISABLE": "0",
		"NCCL_SOCKET_IFNAME": "=eth0", "GLOO_SOCKET_IFNAME": "eth0",
		"RCCL_MSCCL_ENABLE": "0", "RCCL_MSCCLPP_ENABLE": "0", "HSA_NO_SCRATCH_RECLAIM": "1",
		"TORCH_NCCL_HIGH_PRIORITY": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
		"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
		"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "3600", "ZAYA_COLLECTIVE_TIMEOUT": "3600",
	}
	common := map[string]string{
		"NCCL_SOCKET_IFNAME": "=eth0", "GLOO_SOCKET_IFNAME": "eth0",
		"RCCL_MSCCL_ENABLE": "0", "RCCL_MSCCLPP_ENABLE": "0", "HSA_NO_SCRATCH_RECLAIM": "1",
		"TORCH_NCCL_HIGH_PRIORITY": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
		"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
		"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "3600", "ZAYA_COLLECTIVE_TIMEOUT": "3600",
	}
	with := func(base map[string]string, kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	cases := []struct {
		name string
		job  *trainingv1alpha1.ZayaTrainingJob
		want map[string]string
	}{
		{"pollara", testjob.MakeZayaTrainingJob("j", "ns").Defaulted().Obj(), pollara},
		{"roce", testjob.MakeZayaTrainingJob("j", "ns").Profile(trainingv1alpha1.NetworkRoCE).Defaulted().Obj(),
			with(common, "NCCL_IB_GID_INDEX", "3", "NCCL_IB_ROCE_VERSION_NUM", "2", "NCCL_IB_TIMEOUT", "22", "NCCL_IB_RETRY_CNT", "12")},
		{"socket", testjob.MakeZayaTrainingJob("j", "ns").Profile(trainingv1alpha1.NetworkSocket).Defaulted().Obj(),
			with(common, "NCCL_IB_DISABLE", "1", "NCCL_NET", "Socket")},
		{"network.env overrides and adds; timeout and ifname flow through", func() *trainingv1alpha1.ZayaTrainingJob {
			j := testjob.MakeZayaTrainingJob("j", "ns").Defaulted().Obj()
			j.Spec.Network.Env = env("NCCL_NET_PLUGIN", "none", "RCCL_AINIC_ROCE", "1")
			j.Spec.Network.SocketIfname = "bond0"
			j.Spec.Network.CollectiveTimeout = &metav1.Duration{Duration: 7200e9}
			return j
		}(), with(pollara, "NCCL_NET_PLUGIN", "none", "RCCL_AINIC_ROCE", "1",
			"NCCL_SOCKET_IFNAME", "=bond0", "GLOO_SOCKET_IFNAME", "bond0",
			"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "7200", "ZAYA_COLLECTIVE_TIMEOUT", "7200")},
		{"explicit HCAs on RoCE", func() *trainingv1alpha1.ZayaTrainingJob {
			j := testjob.MakeZayaTrainingJob("j", "ns").Profile(trainingv1alpha1.NetworkRoCE).Defaulted().Obj()
			j.Spec.Network.HCAs = []string{"mlx5_0:1", "mlx5_1:1"}
			return j
		}(), with(common, "NCCL_IB_HCA", "mlx5_0:1,mlx5_1:1", "NCCL_IB_GID_INDEX", "3", "NCCL_IB_ROCE_VERSION_NUM", "2",
			"NCCL_IB_TIMEOUT", "22", "NCCL_IB_RETRY_CNT", "12")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := networkEnv(&c.job.Spec)
			if diff := cmp.Diff(c.want, envMap(got)); diff != "" {
				t.Errorf("networkEnv (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTemplateEnvWinsOverTheProfile(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("j", "ns").WorkerEnv("NCCL_IB_GID_INDEX", "3").Defaulted().Obj()
	job.Spec.Network.Env = env("NCCL_IB_GID_INDEX", "2")
	p := newWorkerPod(job, networkEnv(&job.Spec), 0)
	got := envMap(p.Spec.Containers[0].Env)
	if got["NCCL_IB_GID_INDEX"] != "3" {
		t.Errorf("NCCL_IB_GID_INDEX = %q, want the template's 3 (template > network.env > profile)", got["NCCL_IB_GID_INDEX"])
	}
}

func TestNewService(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "team").Obj()
	got := newService(job)
	want := corev1.ServiceSpec{
		ClusterIP: "None", Selector: map[string]string{"training.zaya.dev/job-name": "llm"}, PublishNotReadyAddresses: true,
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
	if c := newCheckpointClaim(testjob.MakeZayaTrainingJob("j", "ns").Defaulted().Obj()); c != nil {
		t.Errorf("claim without checkpoint: %+v", c)
	}
	if c := newCheckpointClaim(testjob.MakeZayaTrainingJob("j", "ns").ClaimCheckpoint("mine").Defaulted().Obj()); c != nil {
		t.Errorf("claim for an existing claim: %+v", c)
	}

	retained := newCheckpointClaim(testjob.MakeZayaTrainingJob("j", "ns").NewCheckpoint("10Ti", "ibmc-vpc-file-3000-iops").Defaulted().Obj())
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
	if c := newCheckpointClaim(owned); len(c.OwnerReferences) != 1 || c.Spec.StorageClassName != nil {
		t.Errorf("unretained claim: owners %v, class %v", c.OwnerReferences, c.Spec.StorageClassName)
	}
}

// TestHeartbeatScriptRunsInAShell runs the probe's script with sh, as the kubelet would.
func TestHeartbeatScriptRunsInAShell(t *testing.T) {
	dir := t.TempDir()
	beat, termLog := filepath.Join(dir, "heartbeat"), filepath.Join(dir, "termination-log")
	run := func() error {
		cmd := exec.Command("sh", "-c", heartbeatScript(60, termLog))
		cmd.Env = append(os.Environ(), "ZAYA_HEARTBEAT_FILE="+beat)
		return cmd.Run()
	}
	if err := run(); err == nil {
		t.Error("no heartbeat yet (past the initial delay) must fail")
	}
	if err := os.WriteFile(beat, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := run(); err != nil {
		t.Errorf("a fresh heartbeat failed the probe: %v", err)
	}
	old := time.Now().Add(-2 * time.Minute)
	if err := os.Chtimes(beat, old, old); err != nil {
		t.Fatal(err)
	}
	if err := run(); err == nil {
		t.Error("a heartbeat 2 minutes old passed a 60 s probe")
	}
	msg, err := os.ReadFile(termLog)
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "worker"}}}}
	exited("n", 137, now)(pod)
	pod.Status.ContainerStatuses[0].State.Terminated.Message = "checkpoint-step=7\n" + string(msg)
	if !hung(pod) {
		t.Errorf("termination message %q is not recognised as a hang", msg)
	}
}

// TestTerminationLogFollowsTheContainer: a template with its own terminationMessagePath gets
// it in ZAYA_TERMINATION_LOG and in the heartbeat probe's hang line.
func TestTerminationLogFollowsTheContainer(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "team").Nodes(1).Defaulted().Obj()
	job.Spec.Template.Spec.Containers[0].TerminationMessagePath = "/var/run/zaya/message"
	pod := newWorkerPod(job, nil, 0)
	w := pod.Spec.Containers[0]
	if got := envMap(w.Env)["ZAYA_TERMINATION_LOG"]; got != "/var/run/zaya/message" {
		t.Errorf("ZAYA_TERMINATION_LOG = %q", got)
	}
	if w.LivenessProbe == nil || !strings.Contains(w.LivenessProbe.Exec.Command[2], ">> /var/run/zaya/message") {
		t.Errorf("probe does not write the container's termination log: %+v", w.LivenessProbe)
	}
}
