package fakedeviceplugin

import (
	"context"
	"maps"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestNodeLabels(t *testing.T) {
	gpu := map[string]string{
		"feature.node.kubernetes.io/amd-gpu":   "true",
		"amd.com/gpu.product-name":             "AMD_Instinct_MI300X_OAM",
		"amd.com/gpu.device-id":                "74a1",
		"amd.com/gpu.family":                   "AI",
		"amd.com/gpu.vram":                     "192G",
		"amd.com/gpu.cu-count":                 "304",
		"amd.com/gpu.compute-memory-partition": "spx_nps1",
	}
	both := maps.Clone(gpu)
	both["feature.node.kubernetes.io/amd-nic"] = "true"
	for _, tc := range []struct {
		gpus, nics int
		want       map[string]string
	}{
		{8, 8, both},
		{8, 0, gpu},
		{0, 8, map[string]string{"feature.node.kubernetes.io/amd-nic": "true"}},
		{0, 0, map[string]string{}},
	} {
		if got := NodeLabels(tc.gpus, tc.nics); !maps.Equal(got, tc.want) {
			t.Errorf("NodeLabels(%d, %d) = %v, want %v", tc.gpus, tc.nics, got, tc.want)
		}
	}
}

func TestLabelPatch(t *testing.T) {
	for _, tc := range []struct {
		labels map[string]string
		want   string
	}{
		{map[string]string{"amd.com/gpu.vram": "192G", "feature.node.kubernetes.io/amd-gpu": "true"},
			`{"metadata":{"labels":{"amd.com/gpu.vram":"192G","feature.node.kubernetes.io/amd-gpu":"true"}}}`},
		{map[string]string{}, `{"metadata":{"labels":{}}}`},
		{map[string]string{"a": `q"uote`}, `{"metadata":{"labels":{"a":"q\"uote"}}}`},
	} {
		got, err := LabelPatch(tc.labels)
		if err != nil || string(got) != tc.want {
			t.Errorf("LabelPatch(%v) = %s, %v; want %s", tc.labels, got, err, tc.want)
		}
	}
}

// The patch adds and overwrites labels and leaves the others, and everything else, alone.
func TestLabelNode(t *testing.T) {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "kind-worker", Labels: map[string]string{
			"kubernetes.io/hostname": "kind-worker", "amd.com/gpu.vram": "old"}},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.1.0/24"},
	}
	c := fake.NewClientset(node)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := LabelNode(ctx, c, "kind-worker", NodeLabels(8, 8)); err != nil {
		t.Fatal(err)
	}
	got, err := c.CoreV1().Nodes().Get(ctx, "kind-worker", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := NodeLabels(8, 8)
	want["kubernetes.io/hostname"] = "kind-worker"
	if !maps.Equal(got.Labels, want) {
		t.Errorf("labels %v, want %v", got.Labels, want)
	}
	if got.Spec.PodCIDR != "10.244.1.0/24" {
		t.Errorf("spec changed: %v", got.Spec)
	}

	// A node that never appears: LabelNode retries until its context ends.
	short, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	if err := LabelNode(short, c, "missing", NodeLabels(8, 8)); err == nil {
		t.Error("labelling a missing node: want an error once the context ends")
	}
}
