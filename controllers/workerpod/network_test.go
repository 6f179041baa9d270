package workerpod

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

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
			got := NetworkEnv(&c.job.Spec)
			if diff := cmp.Diff(c.want, envMap(got)); diff != "" {
				t.Errorf("NetworkEnv (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTemplateEnvWinsOverTheProfile(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("j", "ns").WorkerEnv("NCCL_IB_GID_INDEX", "3").Defaulted().Obj()
	job.Spec.Network.Env = env("NCCL_IB_GID_INDEX", "2")
	p := Render(job, NetworkEnv(&job.Spec), 0)
	got := envMap(p.Spec.Containers[0].Env)
	if got["NCCL_IB_GID_INDEX"] != "3" {
		t.Errorf("NCCL_IB_GID_INDEX = %q, want the template's 3 (template > network.env > profile)", got["NCCL_IB_GID_INDEX"])
	}
}
