package integration

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers"
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

// TestTheInjectedSupervisorPassesRestrictedPodSecurity: with a supervisor image, the operator's
// init container and the worker's wrapped command are admitted where Pod Security "restricted"
// is enforced, for a template that asks nothing of the init container.
func TestTheInjectedSupervisorPassesRestrictedPodSecurity(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespaceEnforcing(t, "restricted")
	startManagerConfigured(t, cfg, nil, podMarkSecret, func(r *controllers.ZayaTrainingJobReconciler) {
		r.SupervisorImage = "registry.example/zaya-worker:v1"
	})
	j := testjob.MakeZayaTrainingJob("supervised", ns).Profile(trainingv1alpha1.NetworkSocket).Nodes(2).Obj()
	j.Spec.Template.Spec.SecurityContext = &corev1.PodSecurityContext{
		RunAsNonRoot:   ptr.To(true),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	j.Spec.Template.Spec.Containers[0].Command = []string{"torchrun", "train.py"}
	g.Expect(k8sClient.Create(ctx, j)).To(Succeed())
	for _, p := range waitPods(g, ns, j.Name, 2) {
		g.Expect(p.Spec.InitContainers).To(HaveLen(1))
		g.Expect(p.Spec.InitContainers[0].Name).To(Equal(trainingv1alpha1.SupervisorInitContainerName))
		g.Expect(p.Spec.Containers[0].Command).To(Equal([]string{"/zaya/bin/zaya-supervisor", "--", "torchrun", "train.py"}))
	}
}
