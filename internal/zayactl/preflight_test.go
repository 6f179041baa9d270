package zayactl

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
)

// readyCluster is what a cluster ready for jobs looks like to preflight.
func readyCluster() facts {
	props := func(p map[string]apiextensionsv1.JSONSchemaProps) apiextensionsv1.JSONSchemaProps {
		return apiextensionsv1.JSONSchemaProps{Properties: p}
	}
	crd := &apiextensionsv1.CustomResourceDefinition{Spec: apiextensionsv1.CustomResourceDefinitionSpec{Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
		Name: "v1alpha1", Served: true, Storage: true, Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
			Properties: map[string]apiextensionsv1.JSONSchemaProps{"status": props(map[string]apiextensionsv1.JSONSchemaProps{
				"goodput": props(map[string]apiextensionsv1.JSONSchemaProps{"history": {}})})}}}}}}}
	node := func(name string, gpus, nics int64) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{workerpod.LabelAMDGPU: "true", productLabel: "AMD_Instinct_MI300X_OAM"}},
			Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{gpuResource: *resource.NewQuantity(gpus, resource.DecimalSI), nicResource: *resource.NewQuantity(nics, resource.DecimalSI)}}}
	}
	return facts{
		Namespace: &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}},
		CRD:       crd,
		Operators: []appsv1.Deployment{{ObjectMeta: metav1.ObjectMeta{Name: "zaya-operator", Namespace: "zaya-system"},
			Spec:   appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Image: "zaya-operator:dev"}}}}},
			Status: appsv1.DeploymentStatus{ReadyReplicas: 1}}},
		RulesKept: true,
		Nodes:     []corev1.Node{node("n0", 8, 8), node("n1", 8, 8), {ObjectMeta: metav1.ObjectMeta{Name: "cpu"}}},
		Classes:   []storagev1.StorageClass{{ObjectMeta: metav1.ObjectMeta{Name: "file"}, Provisioner: "nfs.csi.k8s.io"}},
	}
}

func results(p Preflight) map[string]string {
	out := map[string]string{}
	for _, c := range p.Checks {
		out[c.Name] = c.Result
	}
	return out
}

// A cluster with everything passes; each thing a job cannot do without fails it, and what
// the user may not read only warns.
func TestPreflightFailsOnWhatAJobCannotDoWithout(t *testing.T) {
	if p := preflightOf(readyCluster()); !p.Ready {
		t.Fatalf("a ready cluster: %+v", p.Checks)
	} else {
		for name, r := range results(p) {
			if r != ok {
				t.Errorf("%s: %s on a ready cluster", name, r)
			}
		}
	}
	gone := apierrors.NewNotFound(schema.GroupResource{Resource: "x"}, "x")
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "", nil)
	for _, tc := range []struct {
		name   string
		edit   func(*facts)
		check  string
		result string
		ready  bool
	}{
		{"no restart rules", func(f *facts) { f.RulesKept = false }, "In-place restart", fail, false},
		{"no CRD", func(f *facts) { f.CRD, f.CRDErr = nil, gone }, "CRD", fail, false},
		{"an old CRD", func(f *facts) { f.CRD.Spec.Versions[0].Schema = nil }, "CRD", warn, true},
		{"no operator", func(f *facts) { f.Operators = nil }, "Operator", fail, false},
		{"no operator ready", func(f *facts) { f.Operators[0].Status.ReadyReplicas = 0 }, "Operator", fail, false},
		{"no GPU node", func(f *facts) { f.Nodes = f.Nodes[2:] }, "AMD GPUs", fail, false},
		{"GPU nodes without NFD's label", func(f *facts) { delete(f.Nodes[0].Labels, workerpod.LabelAMDGPU) }, "AMD GPUs", warn, true},
		{"no NICs", func(f *facts) {
			for i := range f.Nodes {
				delete(f.Nodes[i].Status.Allocatable, nicResource)
			}
		}, "AMD NICs", warn, true},
		{"nodes forbidden", func(f *facts) { f.Nodes, f.NodesErr = nil, forbidden }, "AMD GPUs", warn, true},
		{"no file storage", func(f *facts) { f.Classes[0].Provisioner = "ebs.csi.aws.com" }, "Checkpoint storage", warn, true},
		{"no namespace", func(f *facts) { f.Namespace, f.NamespaceErr = nil, gone }, "Pod Security", fail, false},
		{"restricted", func(f *facts) { f.Namespace.Labels = map[string]string{enforceLabel: "restricted"} }, "Pod Security", warn, true},
		{"Kueue without a LocalQueue", func(f *facts) { f.Kueue = true }, "Kueue", warn, true},
		{"Kueue with one", func(f *facts) { f.Kueue, f.LocalQueues = true, 1 }, "Kueue", ok, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := readyCluster()
			tc.edit(&f)
			p := preflightOf(f)
			if got := results(p)[tc.check]; got != tc.result || p.Ready != tc.ready {
				t.Errorf("%s: %q, ready %v; want %q, ready %v (%+v)", tc.check, got, p.Ready, tc.result, tc.ready, p.Checks)
			}
		})
	}
}
