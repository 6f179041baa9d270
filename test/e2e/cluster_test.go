//go:build e2e

package e2e

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func TestFakeNodesLookLikeMI300XWorkers(t *testing.T) {
	g := NewWithT(t)
	nodes := gpuNodes(g)
	g.Expect(len(nodes)).To(BeNumerically(">=", 4))
	for _, n := range nodes {
		g.Expect(n.Status.Allocatable).To(HaveKeyWithValue(corev1.ResourceName("amd.com/gpu"), resource.MustParse("8")), n.Name)
		g.Expect(n.Status.Capacity).To(HaveKeyWithValue(corev1.ResourceName("amd.com/gpu"), resource.MustParse("8")), n.Name)
		g.Expect(n.Status.Allocatable).To(HaveKeyWithValue(corev1.ResourceName("amd.com/nic"), resource.MustParse("8")), n.Name)
		g.Expect(n.Labels).To(HaveKeyWithValue("amd.com/gpu.product-name", "AMD_Instinct_MI300X_OAM"))
		g.Expect(n.Labels).To(HaveKeyWithValue("amd.com/gpu.device-id", "74a1"))
		g.Expect(n.Labels).To(HaveKeyWithValue("feature.node.kubernetes.io/amd-gpu", "true"))
		g.Expect(n.Labels).To(HaveKey("ibm-cloud.kubernetes.io/worker-pool-name"))
		g.Expect(n.Labels).To(HaveKey("topology.kubernetes.io/zone"))
		// IKS labels a worker's instance type with its flavor, whose name has dots; the VPC
		// profile's dashed name is on no IKS node (docs/ibm-cloud.md).
		g.Expect(n.Labels).To(HaveKeyWithValue(corev1.LabelInstanceTypeStable, MatchRegexp(`^[a-z0-9]+\.[0-9]+x[0-9]+(\.[a-z0-9]+)*$`)), n.Name)
		ready := false
		for _, c := range n.Status.Conditions {
			ready = ready || (c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue)
		}
		g.Expect(ready).To(BeTrue(), "node %s is not Ready", n.Name)
	}
}

// gpuNodes are the nodes jobs run on: all but a control plane (kind's runs no GPU job).
func gpuNodes(g Gomega) []corev1.Node {
	nodes := &corev1.NodeList{}
	g.Expect(k8sClient.List(context.Background(), nodes)).To(Succeed())
	var out []corev1.Node
	for _, n := range nodes.Items {
		if _, cp := n.Labels["node-role.kubernetes.io/control-plane"]; !cp {
			out = append(out, n)
		}
	}
	return out
}

// gpuPod asks for gpus amd.com/gpu.
func gpuPod(ns, name string, gpus int64) *corev1.Pod {
	q := *resource.NewQuantity(gpus, resource.DecimalSI)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken: ptr.To(false),
			RestartPolicy:                corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "worker", Image: "zaya-worker:test",
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{"amd.com/gpu": q},
					Limits:   corev1.ResourceList{"amd.com/gpu": q},
				},
			}},
		},
	}
	w.idleContainer(&p.Spec.Containers[0])
	return p
}

func TestSchedulerPlacesPodsByAMDGPUs(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	ctx := context.Background()

	fits, tooBig := gpuPod(ns, "fits", 8), gpuPod(ns, "too-big", 9)
	for _, p := range []*corev1.Pod{fits, tooBig} {
		// The namespace's default ServiceAccount appears a moment after the namespace.
		g.Eventually(func() error { return k8sClient.Create(ctx, p) }, timeout, interval).Should(Succeed())
	}

	g.Eventually(func(g Gomega) {
		got := &corev1.Pod{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(fits), got)).To(Succeed())
		g.Expect(got.Spec.NodeName).NotTo(BeEmpty())
		g.Expect(got.Status.Phase).To(Equal(corev1.PodRunning))
	}, timeout, interval).Should(Succeed())

	g.Eventually(func(g Gomega) {
		got := &corev1.Pod{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(tooBig), got)).To(Succeed())
		g.Expect(got.Spec.NodeName).To(BeEmpty())
		var scheduled *corev1.PodCondition
		for i := range got.Status.Conditions {
			if got.Status.Conditions[i].Type == corev1.PodScheduled {
				scheduled = &got.Status.Conditions[i]
			}
		}
		g.Expect(scheduled).NotTo(BeNil())
		g.Expect(scheduled.Status).To(Equal(corev1.ConditionFalse))
		g.Expect(scheduled.Message).To(ContainSubstring("Insufficient amd.com/gpu"))
	}, timeout, interval).Should(Succeed())
}
