package fakedeviceplugin

import (
	"bufio"
	"errors"
	"io"
	"os"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// The manifest decodes strictly into the API types and says what the package documentation
// and the kind scripts rely on.
func TestDeployManifest(t *testing.T) {
	f, err := os.Open("deploy/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		sa  corev1.ServiceAccount
		cr  rbacv1.ClusterRole
		crb rbacv1.ClusterRoleBinding
		ds  appsv1.DaemonSet
	)
	r := utilyaml.NewYAMLReader(bufio.NewReader(f))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatal(err)
		}
		into := map[string]any{"ServiceAccount": &sa, "ClusterRole": &cr, "ClusterRoleBinding": &crb, "DaemonSet": &ds}[tm.Kind]
		if into == nil {
			t.Fatalf("unexpected kind %q", tm.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, into); err != nil {
			t.Fatalf("%s: %v", tm.Kind, err)
		}
	}

	if len(cr.Rules) != 1 || !slices.Equal(cr.Rules[0].Resources, []string{"nodes"}) || !slices.Equal(cr.Rules[0].Verbs, []string{"get", "patch"}) ||
		!slices.Equal(cr.Rules[0].APIGroups, []string{""}) {
		t.Errorf("ClusterRole rules %v: want get/patch on nodes only", cr.Rules)
	}
	if crb.RoleRef.Name != cr.Name || len(crb.Subjects) != 1 || crb.Subjects[0].Name != sa.Name || crb.Subjects[0].Namespace != sa.Namespace {
		t.Errorf("ClusterRoleBinding %v does not bind %s to %s/%s", crb, cr.Name, sa.Namespace, sa.Name)
	}

	if ds.Namespace != "kube-system" || sa.Namespace != "kube-system" {
		t.Errorf("namespaces %q, %q: want kube-system", ds.Namespace, sa.Namespace)
	}
	pod := ds.Spec.Template.Spec
	if pod.ServiceAccountName != sa.Name {
		t.Errorf("service account %q, want %q", pod.ServiceAccountName, sa.Name)
	}
	terms := pod.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 ||
		terms[0].MatchExpressions[0].Key != "node-role.kubernetes.io/control-plane" || terms[0].MatchExpressions[0].Operator != corev1.NodeSelectorOpDoesNotExist {
		t.Errorf("node affinity %v: want workers only", terms)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	if c.Image != "zaya-fake-device-plugin:dev" || c.ImagePullPolicy != corev1.PullNever {
		t.Errorf("image %s, pull %s", c.Image, c.ImagePullPolicy)
	}
	if len(c.Env) != 1 || c.Env[0].Name != "NODE_NAME" || c.Env[0].ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("env %v: want NODE_NAME from spec.nodeName", c.Env)
	}
	sc := c.SecurityContext
	if sc.Privileged != nil && *sc.Privileged || *sc.AllowPrivilegeEscalation || !*sc.ReadOnlyRootFilesystem ||
		!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 || *sc.RunAsUser != 0 {
		t.Errorf("security context %v", sc)
	}
	if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != "/var/lib/kubelet/device-plugins" ||
		len(pod.Volumes) != 1 || pod.Volumes[0].HostPath.Path != "/var/lib/kubelet/device-plugins" || pod.Volumes[0].Name != c.VolumeMounts[0].Name {
		t.Errorf("volumes %v, mounts %v: want the kubelet's device-plugin directory", pod.Volumes, c.VolumeMounts)
	}
	if !slices.Contains(c.Args, "-label-node") {
		t.Errorf("args %v: want -label-node", c.Args)
	}
	if sel := ds.Spec.Selector.MatchLabels["app.kubernetes.io/name"]; sel == "" || sel != ds.Spec.Template.Labels["app.kubernetes.io/name"] {
		t.Error("selector does not match the template")
	}
}
