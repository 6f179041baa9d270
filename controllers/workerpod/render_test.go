package workerpod

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

	network := NetworkEnv(&job.Spec)
	got := Render(job, network, 1)

	contract := env(
		"MASTER_ADDR", "llm-0.llm.team.svc", "MASTER_PORT", "29500", "WORLD_SIZE", "16", "NNODES", "2",
		"NODE_RANK", "1", "GPUS_PER_NODE", "8", "LOCAL_WORLD_SIZE", "8", "RANK", "8", "LOCAL_RANK", "0", "GROUP_RANK", "1",
		"PET_NNODES", "2", "PET_NODE_RANK", "1", "PET_NPROC_PER_NODE", "8",
		"PET_MASTER_ADDR", "llm-0.llm.team.svc", "PET_MASTER_PORT", "29500",
		"ZAYA_JOB_NAME", "llm", "ZAYA_JOB_UID", "uid-1", "ZAYA_RESTART_ATTEMPT", "3", "ZAYA_CONTEXT_PARALLEL", "1",
		"ZAYA_HEARTBEAT_FILE", "/dev/shm/zaya-heartbeat",
		"ZAYA_CHECKPOINT_DIR", "/checkpoints", "ZAYA_CHECKPOINT_INTERVAL", "50", "ZAYA_CHECKPOINT_KEEP", "3",
		"ZAYA_TERMINATION_LOG", "/dev/termination-log",
	)
	wantEnv := append(append(contract, network...), env("NCCL_DEBUG", "INFO", "MY_RANK", "$(NODE_RANK)")...)
	want := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "llm-3-1", Namespace: "team",
			Labels: map[string]string{
				"team": "llm", "training.zaya.dev/job-name": "llm", "training.zaya.dev/rank": "1", "training.zaya.dev/attempt": "3", "training.zaya.dev/role": "rank",
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
						`f="$ZAYA_HEARTBEAT_FILE"; [ ! -e "$f" ] || [ $(( $(date +%s) - $(stat -c %Y "$f") )) -lt 1800 ] || ` +
							`{ echo "zaya: hang: no heartbeat for 1800s" >> "$ZAYA_TERMINATION_LOG"; exit 1; }`}}},
					InitialDelaySeconds: 1800, PeriodSeconds: 60, TimeoutSeconds: 10, FailureThreshold: 1,
				},
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
				SecurityContext:          &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false)},
			}},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Render (-want +got):\n%s", diff)
	}
	if job.Spec.Template.Spec.Containers[0].Resources.Limits != nil || len(job.Spec.Template.Spec.Volumes) != 0 {
		t.Error("Render changed the job's template")
	}
}

// Decorations run last, in order, on the finished pod and its worker container.
func TestDecorationsRunLastOnTheWorker(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "team").Nodes(2).Defaulted().Obj()
	job.Spec.Template.Spec.Containers = append([]corev1.Container{{Name: "sidecar"}}, job.Spec.Template.Spec.Containers...)
	var order []string
	pod := Render(job, nil, 1,
		func(pod *corev1.Pod, w *corev1.Container) {
			order = append(order, w.Name)
			if w.SecurityContext == nil || w.Resources.Limits == nil || len(pod.Spec.Volumes) == 0 {
				t.Errorf("decoration ran before the pod was finished: %+v", w)
			}
			w.Args = []string{"decorated"}
		},
		func(*corev1.Pod, *corev1.Container) { order = append(order, "second") })
	if !slices.Equal(order, []string{"worker", "second"}) {
		t.Errorf("decorations ran as %v", order)
	}
	if got := pod.Spec.Containers[1].Args; !slices.Equal(got, []string{"decorated"}) {
		t.Errorf("the worker's args %v: the decoration's change was lost", got)
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
			if diff := cmp.Diff(map[string]string{"ibm-cloud.kubernetes.io/worker-pool-name": "mi300x"}, p.Spec.NodeSelector); diff != "" {
				t.Errorf("nodeSelector (-want +got):\n%s", diff)
			}
			// A physical function's label or a virtual function's: NFD labels a VM's VFs amd-vgpu.
			nfd := func(label string) corev1.NodeSelectorTerm {
				return corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: label, Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}}}}
			}
			want := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{nfd("feature.node.kubernetes.io/amd-gpu"), nfd("feature.node.kubernetes.io/amd-vgpu")}}
			if diff := cmp.Diff(want, p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution); diff != "" {
				t.Errorf("required node affinity (-want +got):\n%s", diff)
			}
		}},
		{"NFD's labels with the template's own required terms: each term, with either label", func() *trainingv1alpha1.ZayaTrainingJob {
			j := testjob.MakeZayaTrainingJob("j", "ns").Defaulted().Obj()
			j.Spec.Placement.GPUNodeSelector = trainingv1alpha1.GPUNodeSelectorNFD
			j.Spec.Template.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{
					{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "topology.kubernetes.io/zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"us-east-1"}}}},
					{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "pool", Operator: corev1.NodeSelectorOpIn, Values: []string{"b"}}}},
				}}}}
			return j
		}(), func(t *testing.T, p *corev1.Pod) {
			var got []string
			for _, term := range p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
				var keys []string
				for _, e := range term.MatchExpressions {
					keys = append(keys, e.Key+"="+strings.Join(e.Values, ","))
				}
				got = append(got, strings.Join(keys, " & "))
			}
			want := []string{
				"topology.kubernetes.io/zone=us-east-1 & feature.node.kubernetes.io/amd-gpu=true",
				"pool=b & feature.node.kubernetes.io/amd-gpu=true",
				"topology.kubernetes.io/zone=us-east-1 & feature.node.kubernetes.io/amd-vgpu=true",
				"pool=b & feature.node.kubernetes.io/amd-vgpu=true",
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("required terms (-want +got):\n%s", diff)
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
			p := Render(c.job, NetworkEnv(&c.job.Spec), 0)
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

// TestAPlainEnvInitFindsWhatItReads reads each pod's environment as torch.distributed's env://
// rendezvous does (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), and as training scripts pick
// their device (LOCAL_RANK): with one GPU per node every pod is a distinct rank of the world,
// with 8 the processes a launcher starts (RANK+i, LOCAL_RANK i) cover it exactly once, and
// MASTER_ADDR is rank 0's pod.
func TestAPlainEnvInitFindsWhatItReads(t *testing.T) {
	for _, gpus := range []int32{1, 8} {
		job := testjob.MakeZayaTrainingJob("llm", "team").Nodes(4).GPUsPerNode(gpus).Defaulted().Obj()
		network := NetworkEnv(&job.Spec)
		seen := map[int]int{}
		var rank0 string
		envs := make([]map[string]string, 4)
		for r := range int32(4) {
			pod := Render(job, network, r)
			e := map[string]string{}
			for _, v := range pod.Spec.Containers[0].Env {
				e[v.Name] = v.Value // the last one wins, as in the kubelet
			}
			envs[r] = e
			if e["RANK"] == "0" {
				rank0 = pod.Spec.Hostname + "." + pod.Spec.Subdomain + "." + pod.Namespace + ".svc"
			}
		}
		for r, e := range envs {
			num := func(name string) int {
				v, err := strconv.Atoi(e[name])
				if err != nil {
					t.Fatalf("gpus %d, pod %d: %s=%q is no integer (env:// needs it)", gpus, r, name, e[name])
				}
				return v
			}
			world, rank, local, localWorld, port := num("WORLD_SIZE"), num("RANK"), num("LOCAL_RANK"), num("LOCAL_WORLD_SIZE"), num("MASTER_PORT")
			if rank < 0 || rank >= world || local != 0 || localWorld != int(gpus) || port < 1 || port > 65535 {
				t.Errorf("gpus %d, pod %d: RANK %d of WORLD_SIZE %d, LOCAL_RANK %d of %d, MASTER_PORT %d", gpus, r, rank, world, local, localWorld, port)
			}
			if e["MASTER_ADDR"] != rank0 {
				t.Errorf("gpus %d, pod %d: MASTER_ADDR %q, want rank 0's pod %q", gpus, r, e["MASTER_ADDR"], rank0)
			}
			if num("GROUP_RANK") != num("NODE_RANK") {
				t.Errorf("gpus %d, pod %d: GROUP_RANK %s, NODE_RANK %s", gpus, r, e["GROUP_RANK"], e["NODE_RANK"])
			}
			for i := range localWorld { // the processes a launcher would start
				seen[rank+i]++
			}
		}
		for want := range 4 * int(gpus) {
			if seen[want] != 1 {
				t.Errorf("gpus %d: global rank %d taken %d times", gpus, want, seen[want])
			}
		}
	}
}
