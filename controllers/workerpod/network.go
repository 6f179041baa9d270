package workerpod

import (
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// NetworkEnv is the RCCL, Gloo, HSA and PyTorch environment of a job: the profile's values
// (reasons in docs/worker-contract.md), then spec.network.env, which wins, in a stable order.
func NetworkEnv(spec *trainingv1alpha1.ZayaTrainingJobSpec) []corev1.EnvVar {
	n := &spec.Network
	timeout := strconv.FormatInt(int64(n.CollectiveTimeout.Seconds()), 10)
	var env []corev1.EnvVar
	add := func(name, value string) { env = append(env, corev1.EnvVar{Name: name, Value: value}) }

	if hcas := spec.HCAs(); len(hcas) > 0 {
		add("NCCL_IB_HCA", strings.Join(hcas, ","))
	}
	switch n.Profile {
	case trainingv1alpha1.NetworkPollaraAINIC:
		add("NCCL_CROSS_NIC", "0")
		add("NCCL_IB_GID_INDEX", "1")
		add("NCCL_IB_ROCE_VERSION_NUM", "2")
		add("NCCL_IB_TC", "104")
		add("NCCL_IB_FIFO_TC", "192")
		add("NCCL_IB_TIMEOUT", "22")
		add("NCCL_IB_RETRY_CNT", "12")
		add("NCCL_IB_QPS_PER_CONNECTION", "1")
		add("NCCL_IB_USE_INLINE", "1")
		add("NCCL_GDR_FLUSH_DISABLE", "1")
		add("NCCL_DMABUF_ENABLE", "0")
		add("NCCL_NET_PLUGIN", "librccl-anp.so")
		add("NCCL_PXN_DISABLE", "0")
	case trainingv1alpha1.NetworkRoCE:
		add("NCCL_IB_GID_INDEX", "3")
		add("NCCL_IB_ROCE_VERSION_NUM", "2")
		add("NCCL_IB_TIMEOUT", "22")
		add("NCCL_IB_RETRY_CNT", "12")
	case trainingv1alpha1.NetworkSocket:
		add("NCCL_IB_DISABLE", "1")
		add("NCCL_NET", "Socket")
	}
	// "=" makes RCCL match the interface exactly (eth0, not eth01); Gloo takes a plain name.
	add("NCCL_SOCKET_IFNAME", "="+n.SocketIfname)
	add("GLOO_SOCKET_IFNAME", n.SocketIfname)
	add("RCCL_MSCCL_ENABLE", "0")
	add("RCCL_MSCCLPP_ENABLE", "0")
	add("HSA_NO_SCRATCH_RECLAIM", "1")
	add("TORCH_NCCL_HIGH_PRIORITY", "1")
	add("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
	add("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
	add("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
	add("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", timeout)
	add(trainingv1alpha1.EnvCollectiveTimeout, timeout)

	return overrideEnv(env, n.Env)
}

// overrideEnv replaces variables of base that overrides names and appends the rest of
// overrides, keeping base's order.
func overrideEnv(base, overrides []corev1.EnvVar) []corev1.EnvVar {
	if len(overrides) == 0 {
		return base
	}
	byName := make(map[string]int, len(base))
	for i, e := range base {
		byName[e.Name] = i
	}
	out := append([]corev1.EnvVar(nil), base...)
	for _, o := range overrides {
		if i, ok := byName[o.Name]; ok {
			out[i] = o
			continue
		}
		byName[o.Name] = len(out)
		out = append(out, o)
	}
	return out
}

// needsRDMA reports whether the profile talks RDMA, which pins memory.
func needsRDMA(p trainingv1alpha1.NetworkProfile) bool {
	return p == trainingv1alpha1.NetworkPollaraAINIC || p == trainingv1alpha1.NetworkRoCE
}

// ipcLock reports whether the worker container gets IPC_LOCK: network.ipcLock, else whether
// the profile talks RDMA.
func ipcLock(n *trainingv1alpha1.NetworkSpec) bool {
	if n.IPCLock != nil {
		return *n.IPCLock
	}
	return needsRDMA(n.Profile)
}

// FormatEnv renders variables as NAME=value pairs for events.
func FormatEnv(env []corev1.EnvVar) string {
	parts := make([]string, 0, len(env))
	for _, e := range env {
		v := e.Value
		if e.ValueFrom != nil {
			v = "<from a reference>"
		}
		parts = append(parts, e.Name+"="+v)
	}
	slices.Sort(parts)
	return "network environment: " + strings.Join(parts, " ")
}
