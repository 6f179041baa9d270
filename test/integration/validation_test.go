package integration

import (
	"context"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// validJob is the manifest every case starts from; kubectl apply of it must succeed.
const validJob = `
apiVersion: training.zaya.dev/v1alpha1
kind: ZayaTrainingJob
metadata:
  name: llm
spec:
  nodes: 4
  template:
    spec:
      containers:
      - name: worker
        image: zaya-worker:test
  checkpoint:
    volume:
      size: 10Ti
      storageClassName: ibmc-vpc-file-3000-iops
`

// manifest is validJob with a JSON merge patch (written as YAML) applied.
func manifest(t *testing.T, patch string) *unstructured.Unstructured {
	t.Helper()
	base, err := yaml.YAMLToJSON([]byte(validJob))
	if err != nil {
		t.Fatal(err)
	}
	p, err := yaml.YAMLToJSON([]byte(patch))
	if err != nil {
		t.Fatalf("patch: %v", err)
	}
	merged, err := jsonpatch.MergePatch(base, p)
	if err != nil {
		t.Fatalf("merge: %v", err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(merged); err != nil {
		t.Fatalf("decode: %v", err)
	}
	return u
}

func TestValidManifestIsAccepted(t *testing.T) {
	ns := newNamespace(t)
	u := manifest(t, `{}`)
	u.SetNamespace(ns)
	if err := k8sClient.Create(context.Background(), u); err != nil {
		t.Fatalf("valid manifest rejected: %v", err)
	}
}

func TestSuspendedJobCanBeReshaped(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	u := manifest(t, `spec: {suspend: true}`)
	u.SetNamespace(ns)
	if err := k8sClient.Create(ctx, u); err != nil {
		t.Fatalf("create: %v", err)
	}
	// Kueue resizes and re-targets a suspended job before it admits it.
	reshape, _ := yaml.YAMLToJSON([]byte(`spec: {nodes: 8, network: {profile: RoCE}, template: {spec: {nodeSelector: {pool: mi300x}, containers: [{name: worker, image: zaya-worker:v2}]}}}`))
	if err := k8sClient.Patch(ctx, u, rawMergePatch(reshape)); err != nil {
		t.Fatalf("reshaping a suspended job was refused: %v", err)
	}
	if got, _, _ := unstructured.NestedInt64(u.Object, "spec", "nodes"); got != 8 {
		t.Errorf("spec.nodes = %d after the update, want 8", got)
	}
}
