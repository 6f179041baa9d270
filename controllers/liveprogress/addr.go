package liveprogress

import (
	"net"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/zaya-operator/zaya-operator/api/contract"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
)

// Addr is where a rank's worker serves its progress: its pod's own address, while the pod
// runs ("" otherwise; gang.PodNetworkIP).
func Addr(pod *corev1.Pod) string {
	ip := gang.PodNetworkIP(pod)
	if ip == "" {
		return ""
	}
	return net.JoinHostPort(ip, strconv.Itoa(contract.ProgressPort))
}
