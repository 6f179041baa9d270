package integration

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// TestWorkerPodsPassRestrictedPodSecurity: in a namespace enforcing Pod Security
// "restricted", a job whose template runs as non-root with a seccomp profile gets its pods
// admitted, with the Socket profile and with an RDMA profile whose ipcLock is off (the
// operator's own additions pass); an RDMA job with IPC_LOCK is refused (TestRefusedPods...
// shows that reaching the user).
func TestWorkerPodsPassRestrictedPodSecurity(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespaceEnforcing(t, "restricted")
	startManager(t)

	nonRoot := func(w *testjob.Wrapper) *trainingv1alpha1.ZayaTrainingJob {
		j := w.Nodes(2).NewCheckpoint("1Gi", "").Obj()
		j.Spec.Template.Spec.SecurityContext = &corev1.PodSecurityContext{
			RunAsNonRoot:   ptr.To(true),
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		}
		j.Spec.Template.Spec.InitContainers = []corev1.Container{{Name: "fetch", Image: "busybox"}}
		return j
	}
	socket := nonRoot(testjob.MakeZayaTrainingJob("socket", ns).Profile(trainingv1alpha1.NetworkSocket))
	pollara := nonRoot(testjob.MakeZayaTrainingJob("pollara", ns))
	pollara.Spec.Network.IPCLock = ptr.To(false)
	for _, j := range []*trainingv1alpha1.ZayaTrainingJob{socket, pollara} {
		g.Expect(k8sClient.Create(ctx, j)).To(Succeed())
		pods := waitPods(g, ns, j.Name, 2)
		for _, p := range pods {
			g.Expect(p.Spec.Containers[0].SecurityContext.Capabilities.Drop).To(Equal([]corev1.Capability{"ALL"}))
		}
	}
}
