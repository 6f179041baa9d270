package liveprogress

import (
	"net"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/zaya-operator/zaya-operator/api/contract"
)

// Addr is where a rank's worker serves its progress: its pod's own address, while the pod
// runs ("" otherwise). A pod on the host's network has none: its address is the node's, and
// whatever listens there is not the worker's to answer for.
func Addr(pod *corev1.Pod) string {
	if pod == nil || pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning || pod.Spec.HostNetwork ||
		net.ParseIP(pod.Status.PodIP) == nil || pod.Status.PodIP == pod.Status.HostIP {
		return ""
	}
	return net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(contract.ProgressPort))
}
