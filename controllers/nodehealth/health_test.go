package nodehealth

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

func TestNodeProblem(t *testing.T) {
	node := func(mut func(*corev1.Node)) *corev1.Node {
		n := testjob.HealthyNode("n1")
		mut(n)
		return n
	}
	cases := []struct {
		name   string
		node   *corev1.Node
		reason string
	}{
		{"healthy", node(func(*corev1.Node) {}), ""},
		{"gone", nil, "NodeLost"},
		{"NotReady", node(func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionFalse }), "NodeLost"},
		{"Unknown (kubelet silent)", node(func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionUnknown }), "NodeLost"},
		{"unreachable taint", node(func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute}}
		}), "NodeLost"},
		{"GPU allocatable below capacity", node(func(n *corev1.Node) { n.Status.Allocatable["amd.com/gpu"] = resource.MustParse("7") }), "DeviceUnhealthy"},
		{"NIC allocatable below capacity", node(func(n *corev1.Node) { n.Status.Allocatable["amd.com/nic"] = resource.MustParse("6") }), "DeviceUnhealthy"},
		{"AMD remediation taint", node(func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "amd-gpu-unhealthy", Effect: corev1.TaintEffectNoSchedule}}
		}), "DeviceUnhealthy"},
		{"exporter GPU label", node(func(n *corev1.Node) {
			n.Labels = map[string]string{"metricsexporter.amd.com.gpu.3.state": "unhealthy"}
		}), "DeviceUnhealthy"},
		{"exporter NIC label", node(func(n *corev1.Node) {
			n.Labels = map[string]string{"metricsexporter.amd.com.nic.0000:05:00.0.state": "unhealthy"}
		}), "DeviceUnhealthy"},
		{"exporter label healthy", node(func(n *corev1.Node) {
			n.Labels = map[string]string{"metricsexporter.amd.com.gpu.3.state": "healthy"}
		}), ""},
		{"NPD AMDGPU condition", node(func(n *corev1.Node) {
			n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: "AMDGPUXgmi", Status: corev1.ConditionTrue, Reason: "XgmiLinkDown"})
		}), "DeviceUnhealthy"},
		{"NPD AMDGPU condition False", node(func(n *corev1.Node) {
			n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: "AMDGPUProblem", Status: corev1.ConditionFalse})
		}), ""},
		{"a node without AMD resources is judged by readiness only", node(func(n *corev1.Node) {
			n.Status.Capacity, n.Status.Allocatable = nil, nil
		}), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			reason, msg := Problem("n1", c.node)
			if reason != c.reason {
				t.Errorf("Problem = %q (%s), want %q", reason, msg, c.reason)
			}
		})
	}
}

// TestNodeProblemNamesTheLowestUnhealthyLabel: the message must not change from one pass to
// the next (labels are a map), or every pass would rewrite the failure.
func TestNodeProblemNamesTheLowestUnhealthyLabel(t *testing.T) {
	n := testjob.HealthyNode("n1")
	n.Labels = map[string]string{"kubernetes.io/hostname": "n1", "metricsexporter.amd.com.gpu.1.state": "healthy"}
	for _, k := range []string{"metricsexporter.amd.com.gpu.7.state", "metricsexporter.amd.com.gpu.2.state", "metricsexporter.amd.com.nic.0000:05:00.0.state"} {
		n.Labels[k] = "unhealthy"
	}
	for range 20 {
		if _, msg := Problem("n1", n); msg != "node n1 is labelled metricsexporter.amd.com.gpu.2.state=unhealthy" {
			t.Fatalf("message %q", msg)
		}
	}
}

// BenchmarkNodeProblem is the health check paid for every rank of every pass and twice for
// every node update, on a healthy node with the labels a real GPU node carries.
func BenchmarkNodeProblem(b *testing.B) {
	n := testjob.HealthyNode("n1")
	n.Labels = map[string]string{}
	for i := range 40 {
		n.Labels[fmt.Sprintf("feature.node.kubernetes.io/feature-%d", i)] = "true"
	}
	for i := range 8 {
		n.Labels[fmt.Sprintf("metricsexporter.amd.com.gpu.%d.state", i)] = "healthy"
	}
	b.ReportAllocs()
	for b.Loop() {
		if r, _ := Problem("n1", n); r != "" {
			b.Fatal(r)
		}
	}
}
