package fakedeviceplugin

import (
	"context"
	"encoding/json"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// NodeLabels is what AMD's node labeller and Node Feature Discovery put on an MI300X node:
// the keys and values of the kwok nodes in hack/cluster/mi300x-node.yaml (and
// amd.com/gpu.family, as test/nodeagent sets it). GPU labels only with gpus > 0, the NIC
// feature label only with nics > 0.
func NodeLabels(gpus, nics int) map[string]string {
	l := map[string]string{}
	if gpus > 0 {
		l["feature.node.kubernetes.io/amd-gpu"] = "true"
		l["amd.com/gpu.product-name"] = "AMD_Instinct_MI300X_OAM"
		l["amd.com/gpu.device-id"] = "74a1"
		l["amd.com/gpu.family"] = "AI"
		l["amd.com/gpu.vram"] = "192G"
		l["amd.com/gpu.cu-count"] = "304"
		l["amd.com/gpu.compute-memory-partition"] = "spx_nps1"
	}
	if nics > 0 {
		l["feature.node.kubernetes.io/amd-nic"] = "true"
	}
	return l
}

// LabelPatch is the JSON merge patch that sets labels on an object and touches nothing else.
func LabelPatch(labels map[string]string) ([]byte, error) {
	return json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
}

// LabelNode merge-patches labels onto node, retrying (the API server may not be reachable
// yet when the pod starts) until it succeeds or ctx ends.
func LabelNode(ctx context.Context, c kubernetes.Interface, node string, labels map[string]string) error {
	body, err := LabelPatch(labels)
	if err != nil {
		return err
	}
	backoff := time.Second
	for {
		_, err := c.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, body, metav1.PatchOptions{FieldManager: "amd-fake-device-plugin"})
		if err == nil {
			klog.InfoS("Labelled the node", "node", node, "labels", labels)
			return nil
		}
		klog.InfoS("Cannot label the node yet; retrying", "node", node, "in", backoff, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}
