// Package chart tests the Helm chart (charts/zaya-operator) and the kustomize install
// (config/default): what they render, that both grant exactly the generated RBAC and ship the
// generated CRD, and that bad values fail with the key's name. The install on a real cluster
// is in install_test.go (build tag e2e, hack/helm-e2e.sh).
package chart

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/zaya-operator/zaya-operator/controllers"
	"github.com/zaya-operator/zaya-operator/controllers/attribution"
)

var (
	root     = filepath.Join("..", "..")
	chartDir = filepath.Join(root, "charts", "zaya-operator")
)

// tool finds a pinned binary in bin/ (or $ZAYA_<NAME>); tests fail rather than skip without it.
func tool(t *testing.T, name string) string {
	t.Helper()
	if p := os.Getenv("ZAYA_" + strings.ToUpper(name)); p != "" {
		return p
	}
	p, err := filepath.Abs(filepath.Join(root, "bin", name))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is missing: run `make tools` (hack/tools.sh builds it): %v", name, err)
	}
	return p
}

func run(t *testing.T, bin string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, errOut.String()) //nolint:errorlint // the message is what matters
	}
	return out.String(), nil
}

// render runs helm template for release "zaya-operator" in zaya-system with extra args.
func render(t *testing.T, args ...string) ([]*unstructured.Unstructured, error) {
	t.Helper()
	out, err := run(t, tool(t, "helm"), append([]string{"template", "zaya-operator", chartDir, "-n", "zaya-system"}, args...)...)
	if err != nil {
		return nil, err
	}
	return decode(t, out), nil
}

func mustRender(t *testing.T, args ...string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := render(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// decode splits a multi-document YAML stream into objects.
func decode(t *testing.T, s string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	d := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(s), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := d.Decode(&u.Object); errors.Is(err, io.EOF) {
			return objs
		} else if err != nil {
			t.Fatalf("decoding rendered YAML: %v", err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

// typed converts u into out, failing on any field the Go type does not know (a misspelled
// key in a template would otherwise be dropped silently by the API server's pruning).
func typed[T any](t *testing.T, u *unstructured.Unstructured) *T {
	t.Helper()
	if u == nil {
		t.Fatalf("the %T is missing", *new(T))
	}
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, out, true); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
	return out
}

func find(objs []*unstructured.Unstructured, kind, ns, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetNamespace() == ns && (name == "" || o.GetName() == name) {
			return o
		}
	}
	return nil
}

// findRole is the first Role in the operator's namespace whose name ends in suffix.
func findRole(objs []*unstructured.Unstructured, suffix string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == "Role" && o.GetNamespace() == "zaya-system" && strings.HasSuffix(o.GetName(), suffix) {
			return o
		}
	}
	return nil
}

func kinds(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetKind()+"/"+o.GetNamespace())
	}
	sort.Strings(out)
	return out
}

// grant is one (group, resource, verb): rules compare as sets of these.
type grant struct{ group, resource, verb, name string }

func grants(rules []rbacv1.PolicyRule) []grant {
	var out []grant
	for _, r := range rules {
		names := r.ResourceNames
		if len(names) == 0 {
			names = []string{""}
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					for _, n := range names {
						out = append(out, grant{g, res, v, n})
					}
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return fmt.Sprint(out[i]) < fmt.Sprint(out[j]) })
	return slices.Compact(out)
}

// generatedRules are config/rbac/role.yaml's, which controller-gen writes from the markers.
func generatedRules(t *testing.T) []rbacv1.PolicyRule {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "config", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict(b, &role); err != nil {
		t.Fatal(err)
	}
	if len(role.Rules) == 0 {
		t.Fatal("config/rbac/role.yaml has no rules")
	}
	return role.Rules
}

func TestChartShipsTheGeneratedCRD(t *testing.T) {
	want, _ := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
	got, _ := filepath.Glob(filepath.Join(chartDir, "crds", "*.yaml"))
	base := func(ps []string) (out []string) {
		for _, p := range ps {
			out = append(out, filepath.Base(p))
		}
		return out
	}
	if len(want) == 0 || !slices.Equal(base(want), base(got)) {
		t.Fatalf("chart crds/ %v != config/crd/bases %v: run make manifests", base(got), base(want))
	}
	for i := range want {
		a, _ := os.ReadFile(want[i])
		b, _ := os.ReadFile(got[i])
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs from %s: run make manifests", got[i], want[i])
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(b, &crd); err != nil {
			t.Errorf("%s: %v", got[i], err)
		}
	}
}

func TestChartGrantsExactlyTheGeneratedRBAC(t *testing.T) {
	want := grants(generatedRules(t))

	// Cluster scope: one ClusterRole with every generated rule.
	objs := mustRender(t)
	cr := typed[rbacv1.ClusterRole](t, find(objs, "ClusterRole", "", "zaya-operator"))
	if diff := cmp.Diff(want, grants(cr.Rules), cmp.AllowUnexported(grant{})); diff != "" {
		t.Errorf("cluster-scoped ClusterRole differs from config/rbac/role.yaml (-want +got):\n%s", diff)
	}
	if find(objs, "Role", "team-a", "") != nil {
		t.Error("a cluster-scoped install made namespaced Roles")
	}

	// Namespace scope: nodes cluster-wide, everything else in each watched namespace only.
	objs = mustRender(t, "-f", filepath.Join("testdata", "namespaced.yaml"))
	cr = typed[rbacv1.ClusterRole](t, find(objs, "ClusterRole", "", "zaya-operator"))
	for _, g := range grants(cr.Rules) {
		if g.resource != "nodes" {
			t.Errorf("a namespace-scoped install grants %v cluster-wide", g)
		}
	}
	for _, ns := range []string{"team-a", "team-b"} {
		role := typed[rbacv1.Role](t, find(objs, "Role", ns, "zaya-operator"))
		got := grants(append(slices.Clone(cr.Rules), role.Rules...))
		if diff := cmp.Diff(want, got, cmp.AllowUnexported(grant{})); diff != "" {
			t.Errorf("namespace %s: ClusterRole + Role differ from config/rbac/role.yaml (-want +got):\n%s", ns, diff)
		}
		rb := typed[rbacv1.RoleBinding](t, find(objs, "RoleBinding", ns, "zaya-operator"))
		if rb.RoleRef.Name != "zaya-operator" || len(rb.Subjects) != 1 || rb.Subjects[0].Namespace != "zaya-system" {
			t.Errorf("namespace %s: binding %+v does not bind the operator's account", ns, rb)
		}
	}
	dep := typed[appsv1.Deployment](t, find(objs, "Deployment", "zaya-system", "zaya-operator"))
	if !slices.Contains(dep.Spec.Template.Spec.Containers[0].Args, "--namespaces=team-a,team-b") {
		t.Errorf("a namespace-scoped operator watches all namespaces: %v", dep.Spec.Template.Spec.Containers[0].Args)
	}
}

func TestChartRendersEachValueSet(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		check func(t *testing.T, objs []*unstructured.Unstructured, dep *appsv1.Deployment)
	}{{
		name: "defaults",
		check: func(t *testing.T, objs []*unstructured.Unstructured, dep *appsv1.Deployment) {
			// Three Roles: leader election, the pod-mark key and the failure patterns (with their
			// ConfigMap); ClusterRoles for the operator, the metrics endpoint's reviews and its
			// readers.
			want := []string{"ClusterRole/", "ClusterRole/", "ClusterRole/", "ClusterRoleBinding/", "ClusterRoleBinding/", "ConfigMap/zaya-system", "Deployment/zaya-system", "Role/zaya-system", "Role/zaya-system",
				"Role/zaya-system", "RoleBinding/zaya-system", "RoleBinding/zaya-system", "RoleBinding/zaya-system", "Service/zaya-system", "ServiceAccount/zaya-system"}
			if diff := cmp.Diff(want, kinds(objs)); diff != "" {
				t.Errorf("objects (-want +got):\n%s", diff)
			}
			c := dep.Spec.Template.Spec.Containers[0]
			if c.Image != "ghcr.io/zaya-operator/zaya-operator:0.1.0" {
				t.Errorf("image %q, want the chart's appVersion", c.Image)
			}
			for _, a := range []string{"--leader-elect=true", "--leader-election-namespace=$(POD_NAMESPACE)", "--metrics-bind-address=:8443", "--metrics-secure=true"} {
				if !slices.Contains(c.Args, a) {
					t.Errorf("args %v lack %s", c.Args, a)
				}
			}
			if slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--namespaces") }) {
				t.Errorf("the default install should watch all namespaces: %v", c.Args)
			}
			// The supervisor comes from the worker image of the operator's own version.
			if !slices.Contains(c.Args, "--supervisor-image=ghcr.io/zaya-operator/zaya-worker:0.1.0") {
				t.Errorf("args %v lack the worker image of the chart's appVersion as the supervisor image", c.Args)
			}
			restricted(t, dep)
			svc := typed[corev1.Service](t, find(objs, "Service", "zaya-system", "zaya-operator-metrics"))
			if svc.Spec.Ports[0].TargetPort.StrVal != "metrics" || svc.Spec.Selector["app.kubernetes.io/instance"] != "zaya-operator" {
				t.Errorf("metrics service %+v does not reach the operator's metrics port", svc.Spec)
			}
		},
	}, {
		name: "supervisor image",
		args: []string{"--set", "supervisorImage=us.icr.io/zaya/zaya-worker:rocm"},
		check: func(t *testing.T, objs []*unstructured.Unstructured, dep *appsv1.Deployment) {
			if a := dep.Spec.Template.Spec.Containers[0].Args; !slices.Contains(a, "--supervisor-image=us.icr.io/zaya/zaya-worker:rocm") {
				t.Errorf("args %v lack the supervisor image", a)
			}
		},
	}, {
		name: "no supervisor",
		args: []string{"--set", "supervisorImage="},
		check: func(t *testing.T, objs []*unstructured.Unstructured, dep *appsv1.Deployment) {
			if a := dep.Spec.Template.Spec.Containers[0].Args; slices.ContainsFunc(a, func(a string) bool { return strings.HasPrefix(a, "--supervisor-image") }) {
				t.Errorf("supervisorImage is empty, yet %v names one", a)
			}
		},
	}, {
		name: "ha",
		args: []string{"-f", filepath.Join("testdata", "ha.yaml")},
		check: func(t *testing.T, objs []*unstructured.Unstructured, dep *appsv1.Deployment) {
			if *dep.Spec.Replicas != 2 {
				t.Errorf("replicas %d", *dep.Spec.Replicas)
			}
			pdb := find(objs, "PodDisruptionBudget", "zaya-system", "zaya-operator")
			if pdb == nil {
				t.Fatal("two replicas and no PodDisruptionBudget")
			}
			p := typed[policyv1.PodDisruptionBudget](t, pdb)
			if p.Spec.MinAvailable.IntValue() != 1 || !cmp.Equal(p.Spec.Selector.MatchLabels, dep.Spec.Selector.MatchLabels) {
				t.Errorf("PodDisruptionBudget %+v does not keep one operator pod", p.Spec)
			}
			if dep.Spec.Template.Spec.Affinity == nil || dep.Spec.Template.Spec.Affinity.PodAntiAffinity == nil {
				t.Error("affinity from values was dropped")
			}
			// Replicas spread over nodes by default, selecting this release's pods only.
			tsc := dep.Spec.Template.Spec.TopologySpreadConstraints
			if len(tsc) != 1 || tsc[0].TopologyKey != "kubernetes.io/hostname" || !cmp.Equal(tsc[0].LabelSelector.MatchLabels, dep.Spec.Selector.MatchLabels) {
				t.Errorf("spread %+v: want the release's replicas spread over nodes", tsc)
			}
			if dep.Spec.Selector.MatchLabels["app.kubernetes.io/instance"] != "zaya-operator" {
				t.Errorf("selector %v: another release's pods would match", dep.Spec.Selector.MatchLabels)
			}
		},
	}, {
		name: "monitoring",
		args: []string{"-f", filepath.Join("testdata", "monitoring.yaml")},
		check: func(t *testing.T, objs []*unstructured.Unstructured, dep *appsv1.Deployment) {
			sm := find(objs, "ServiceMonitor", "zaya-system", "zaya-operator")
			if sm == nil {
				t.Fatal("no ServiceMonitor")
			}
			if sm.GetLabels()["release"] != "kube-prometheus-stack" {
				t.Errorf("ServiceMonitor labels %v", sm.GetLabels())
			}
			ep, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
			if len(ep) != 1 || ep[0].(map[string]any)["port"] != "metrics" {
				t.Errorf("ServiceMonitor endpoints %v", ep)
			}
			// Secure metrics: Prometheus scrapes over HTTPS with its token, and may.
			if e := ep[0].(map[string]any); e["scheme"] != "https" || e["bearerTokenFile"] == nil {
				t.Errorf("ServiceMonitor endpoint %v: want https with Prometheus's token", e)
			}
			// The dashboard, for Grafana's sidecar where it looks, and the alerts with their values.
			cm := typed[corev1.ConfigMap](t, find(objs, "ConfigMap", "monitoring", "zaya-operator-dashboard"))
			if cm.Labels["grafana_dashboard"] != "1" || cm.Annotations["grafana_folder"] != "Training" || !json.Valid([]byte(cm.Data["zaya-operator.json"])) {
				t.Errorf("dashboard ConfigMap labels %v, annotations %v, valid JSON %v", cm.Labels, cm.Annotations, json.Valid([]byte(cm.Data["zaya-operator.json"])))
			}
			rule := find(objs, "PrometheusRule", "zaya-system", "zaya-operator")
			if rule == nil || rule.GetLabels()["release"] != "kube-prometheus-stack" {
				t.Fatalf("PrometheusRule %v", rule)
			}
			groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
			first := groups[0].(map[string]any)["rules"].([]any)[0].(map[string]any)
			if first["alert"] != "ZayaJobNotTraining" || first["expr"] != "zaya_job_not_training_seconds > 1800" {
				t.Errorf("first alert %v: want ZayaJobNotTraining after 30 minutes", first)
			}
			crb := typed[rbacv1.ClusterRoleBinding](t, find(objs, "ClusterRoleBinding", "", "zaya-operator-metrics-reader"))
			if crb.RoleRef.Name != "zaya-operator-metrics-reader" || len(crb.Subjects) != 1 || crb.Subjects[0].Name != "prometheus-k8s" || crb.Subjects[0].Namespace != "monitoring" {
				t.Errorf("metrics readers binding %+v", crb)
			}
			np := typed[networkingv1.NetworkPolicy](t, find(objs, "NetworkPolicy", "zaya-system", "zaya-operator"))
			if len(np.Spec.Ingress) != 1 || np.Spec.Ingress[0].Ports[0].Port.StrVal != "metrics" ||
				np.Spec.Ingress[0].From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "monitoring" {
				t.Errorf("NetworkPolicy ingress %+v", np.Spec.Ingress)
			}
			c := dep.Spec.Template.Spec.Containers[0]
			if c.Image != "registry.example.com/zaya-operator@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" {
				t.Errorf("image %q: the digest should pin it", c.Image)
			}
			for _, a := range []string{"--zap-log-level=debug", "--zap-encoder=console", "--concurrency=32", "--kube-api-qps=1000", "--kube-api-burst=2000"} {
				if !slices.Contains(c.Args, a) {
					t.Errorf("args %v lack %s", c.Args, a)
				}
			}
			if len(dep.Spec.Template.Spec.ImagePullSecrets) != 1 {
				t.Errorf("pull secrets %v", dep.Spec.Template.Spec.ImagePullSecrets)
			}
		},
	}, {
		name: "ibm-cloud",
		args: []string{"-f", filepath.Join(root, "examples", "ibm-cloud", "values.yaml")},
		check: func(t *testing.T, objs []*unstructured.Unstructured, dep *appsv1.Deployment) {
			ps := dep.Spec.Template.Spec
			if ps.NodeSelector["ibm-cloud.kubernetes.io/worker-pool-name"] != "default" {
				t.Errorf("node selector %v: the operator belongs on the CPU pool", ps.NodeSelector)
			}
			if len(ps.ImagePullSecrets) != 1 || ps.ImagePullSecrets[0].Name != "all-icr-io" {
				t.Errorf("pull secrets %v", ps.ImagePullSecrets)
			}
			if len(ps.TopologySpreadConstraints) != 1 || ps.TopologySpreadConstraints[0].TopologyKey != "topology.kubernetes.io/zone" {
				t.Errorf("zone spread %v", ps.TopologySpreadConstraints)
			}
			if find(objs, "PodDisruptionBudget", "zaya-system", "") == nil || find(objs, "NetworkPolicy", "zaya-system", "") == nil {
				t.Errorf("objects %v: want a PodDisruptionBudget and a NetworkPolicy", kinds(objs))
			}
			restricted(t, dep)
		},
	}, {
		name: "plain metrics",
		args: []string{"--set", "metrics.secure=false", "--set", "metrics.port=8080"},
		check: func(t *testing.T, objs []*unstructured.Unstructured, dep *appsv1.Deployment) {
			if c := dep.Spec.Template.Spec.Containers[0]; !slices.Contains(c.Args, "--metrics-secure=false") || !slices.Contains(c.Args, "--metrics-bind-address=:8080") {
				t.Errorf("args %v", c.Args)
			}
			if find(objs, "ClusterRole", "", "zaya-operator-metrics-auth") != nil {
				t.Error("token reviews granted for plain metrics")
			}
		},
	}, {
		name: "metrics certificate",
		args: []string{"--set", "metrics.certSecret=zaya-metrics-tls"},
		check: func(t *testing.T, objs []*unstructured.Unstructured, dep *appsv1.Deployment) {
			ps := dep.Spec.Template.Spec
			if !slices.Contains(ps.Containers[0].Args, "--metrics-cert-dir=/metrics-certs") || len(ps.Volumes) != 1 || ps.Volumes[0].Secret.SecretName != "zaya-metrics-tls" ||
				len(ps.Containers[0].VolumeMounts) != 1 || !ps.Containers[0].VolumeMounts[0].ReadOnly {
				t.Errorf("args %v, volumes %+v, mounts %+v: want the Secret mounted read-only as the cert dir", ps.Containers[0].Args, ps.Volumes, ps.Containers[0].VolumeMounts)
			}
			restricted(t, dep)
		},
	}, {
		name: "metrics off",
		args: []string{"--set", "metrics.port=0"},
		check: func(t *testing.T, objs []*unstructured.Unstructured, dep *appsv1.Deployment) {
			c := dep.Spec.Template.Spec.Containers[0]
			if !slices.Contains(c.Args, "--metrics-bind-address=0") || len(c.Ports) != 1 {
				t.Errorf("args %v ports %v", c.Args, c.Ports)
			}
			if find(objs, "Service", "zaya-system", "") != nil {
				t.Error("a metrics Service with metrics off")
			}
		},
	}, {
		name: "no leader election, existing account",
		args: []string{"--set", "leaderElection.enabled=false", "--set", "serviceAccount.create=false", "--set", "serviceAccount.name=ops"},
		check: func(t *testing.T, objs []*unstructured.Unstructured, dep *appsv1.Deployment) {
			if dep.Spec.Template.Spec.ServiceAccountName != "ops" || find(objs, "ServiceAccount", "zaya-system", "") != nil {
				t.Errorf("service account %q, objects %v", dep.Spec.Template.Spec.ServiceAccountName, kinds(objs))
			}
			if findRole(objs, "-leader-election") != nil {
				t.Error("a leader-election Role without leader election")
			}
			if findRole(objs, "-pod-mark") == nil {
				t.Error("no pod-mark Role without leader election")
			}
			if !slices.Contains(dep.Spec.Template.Spec.Containers[0].Args, "--leader-elect=false") {
				t.Errorf("args %v", dep.Spec.Template.Spec.Containers[0].Args)
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			objs := mustRender(t, tc.args...)
			for _, o := range objs {
				if o.GetKind() != "ClusterRole" && o.GetKind() != "ClusterRoleBinding" && o.GetKind() != "StorageClass" && o.GetNamespace() != "zaya-system" &&
					o.GetKind() != "Role" && o.GetKind() != "RoleBinding" && o.GetName() != "zaya-operator-dashboard" { // the dashboard goes where Grafana's sidecar looks
					t.Errorf("%s %s is not in the release namespace", o.GetKind(), o.GetName())
				}
				if o.GetLabels()["app.kubernetes.io/managed-by"] != "Helm" {
					t.Errorf("%s %s lacks the chart's labels", o.GetKind(), o.GetName())
				}
			}
			dep := typed[appsv1.Deployment](t, find(objs, "Deployment", "zaya-system", "zaya-operator"))
			if sa := find(objs, "ServiceAccount", "zaya-system", ""); sa != nil {
				typed[corev1.ServiceAccount](t, sa)
			}
			tc.check(t, objs, dep)
		})
	}
}

// restricted checks what Pod Security "restricted" asks of the operator's pod (the install
// test has the API server enforce it for real).
func restricted(t *testing.T, dep *appsv1.Deployment) {
	t.Helper()
	ps := dep.Spec.Template.Spec
	if ps.SecurityContext == nil || ps.SecurityContext.RunAsNonRoot == nil || !*ps.SecurityContext.RunAsNonRoot ||
		ps.SecurityContext.SeccompProfile == nil || ps.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v is not restricted", ps.SecurityContext)
	}
	sc := ps.Containers[0].SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil ||
		!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("container securityContext %+v is not restricted", sc)
	}
	if sc != nil && sc.Privileged != nil && *sc.Privileged {
		t.Error("privileged operator")
	}
}

func TestChartRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--set", "rbac.scope=Namespace"}, "rbac.scope=Namespace needs watchNamespaces"},
		{[]string{"--set", "rbac.scope=Tenant"}, "/rbac/scope"},
		{[]string{"--set", "replicaCount=2", "--set", "leaderElection.enabled=false"}, "replicaCount > 1 needs leaderElection.enabled"},
		{[]string{"--set", "metrics.port=0", "--set", "metrics.serviceMonitor.enabled=true"}, "metrics.serviceMonitor.enabled needs metrics.port"},
		{[]string{"--set", "imagee.tag=x"}, "additional properties 'imagee' not allowed"},
		{[]string{"--set", "logLevel=loud"}, "/logLevel"},
		{[]string{"--set", "logLevel=0"}, "/logLevel"}, // zap refuses level 0
		{[]string{"--set", "image.digest=latest"}, "/image/digest"},
		{[]string{"--set", "watchNamespaces={Team_A}"}, "/watchNamespaces/0"},
		{[]string{"--set", "extraArgs={leader-elect}"}, "/extraArgs/0"},
		{[]string{"--set", "concurrency=0"}, "/concurrency"},
		{[]string{"--set", "supervisorImage=a b"}, "/supervisorImage"},
		{[]string{"--set", "probes.port=70000"}, "/probes/port"},
		{[]string{"--set", "serviceAccount.create=false"}, "serviceAccount.name is required"},
		{[]string{"--set", "checkpointStorageClass.create=true", "--set", "checkpointStorageClass.provisioner=vpc.file.csi.ibm.io"}, "/checkpointStorageClass/name"},
		{[]string{"--set", "checkpointStorageClass.reclaimPolicy=Recycle"}, "/checkpointStorageClass/reclaimPolicy"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, err := render(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("want an error naming %q, got %v", tc.want, err)
			}
		})
	}
}

func TestChartLints(t *testing.T) {
	helm := tool(t, "helm")
	sets := [][]string{nil, {"-f", filepath.Join(root, "examples", "ibm-cloud", "values.yaml")}}
	files, _ := filepath.Glob(filepath.Join("testdata", "*.yaml"))
	for _, f := range files {
		sets = append(sets, []string{"-f", f})
	}
	for _, s := range sets {
		if out, err := run(t, helm, append([]string{"lint", "--strict", chartDir}, s...)...); err != nil {
			t.Errorf("helm lint %v: %v\n%s", s, err, out)
		}
	}
}

// TestKustomizeInstallsTheSameOperator: config/default and the chart's defaults run the same
// binary with the same flags, probes, security and RBAC.
func TestKustomizeInstallsTheSameOperator(t *testing.T) {
	out, err := run(t, tool(t, "kubectl"), "kustomize", filepath.Join(root, "config", "default"))
	if err != nil {
		t.Fatal(err)
	}
	kust := decode(t, out)
	chart := mustRender(t)

	kdep := typed[appsv1.Deployment](t, find(kust, "Deployment", "zaya-system", ""))
	cdep := typed[appsv1.Deployment](t, find(chart, "Deployment", "zaya-system", ""))
	kc, cc := kdep.Spec.Template.Spec.Containers[0], cdep.Spec.Template.Spec.Containers[0]
	for _, f := range []struct {
		name string
		a, b any
	}{
		{"command", kc.Command, cc.Command},
		{"args", kc.Args, cc.Args},
		{"env", kc.Env, cc.Env},
		{"ports", kc.Ports, cc.Ports},
		{"livenessProbe", kc.LivenessProbe, cc.LivenessProbe},
		{"readinessProbe", kc.ReadinessProbe, cc.ReadinessProbe},
		{"resources", kc.Resources, cc.Resources},
		{"securityContext", kc.SecurityContext, cc.SecurityContext},
		{"podSecurityContext", kdep.Spec.Template.Spec.SecurityContext, cdep.Spec.Template.Spec.SecurityContext},
		{"automountServiceAccountToken", kdep.Spec.Template.Spec.AutomountServiceAccountToken, cdep.Spec.Template.Spec.AutomountServiceAccountToken},
		{"terminationGracePeriodSeconds", kdep.Spec.Template.Spec.TerminationGracePeriodSeconds, cdep.Spec.Template.Spec.TerminationGracePeriodSeconds},
		{"replicas", kdep.Spec.Replicas, cdep.Spec.Replicas},
	} {
		if diff := cmp.Diff(f.a, f.b); diff != "" {
			t.Errorf("%s: kustomize (-) and chart (+) differ:\n%s", f.name, diff)
		}
	}
	restricted(t, kdep)

	kcr := typed[rbacv1.ClusterRole](t, find(kust, "ClusterRole", "", "zaya-operator-manager-role"))
	if diff := cmp.Diff(grants(generatedRules(t)), grants(kcr.Rules), cmp.AllowUnexported(grant{})); diff != "" {
		t.Errorf("kustomize ClusterRole differs from the generated rules:\n%s", diff)
	}
	for _, role := range []struct{ kust, chart string }{{"leader-election-role", "-leader-election"}, {"pod-mark-role", "-pod-mark"}} {
		krole := typed[rbacv1.Role](t, findRole(kust, role.kust))
		crole := typed[rbacv1.Role](t, findRole(chart, role.chart))
		if diff := cmp.Diff(grants(krole.Rules), grants(crole.Rules), cmp.AllowUnexported(grant{})); diff != "" {
			t.Errorf("%s Role: kustomize (-) and chart (+) differ:\n%s", role.kust, diff)
		}
	}
	// The metrics endpoint's own grants, the same both ways.
	for _, role := range []struct{ kust, chart string }{{"zaya-operator-metrics-auth-role", "zaya-operator-metrics-auth"}, {"zaya-operator-metrics-reader", "zaya-operator-metrics-reader"}} {
		krole := typed[rbacv1.ClusterRole](t, find(kust, "ClusterRole", "", role.kust))
		crole := typed[rbacv1.ClusterRole](t, find(chart, "ClusterRole", "", role.chart))
		if diff := cmp.Diff(krole.Rules, crole.Rules); diff != "" {
			t.Errorf("%s: kustomize (-) and chart (+) differ:\n%s", role.kust, diff)
		}
	}
	for _, kind := range []string{"ServiceAccount", "ClusterRoleBinding", "RoleBinding", "Service"} {
		if (find(kust, kind, "", "") == nil && find(kust, kind, "zaya-system", "") == nil) ||
			(find(chart, kind, "", "") == nil && find(chart, kind, "zaya-system", "") == nil) {
			t.Errorf("%s: only one of kustomize and the chart makes one", kind)
		}
	}
	ns := typed[corev1.Namespace](t, find(kust, "Namespace", "", "zaya-system"))
	if ns.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
		t.Errorf("kustomize's namespace labels %v: want Pod Security restricted enforced", ns.Labels)
	}
}

// The chart's failurePatterns become the ConfigMap the operator reads, as a table it accepts;
// a bad category is refused at install by the values schema.
func TestFailurePatternsValuesBecomeATableTheOperatorReads(t *testing.T) {
	objs := mustRender(t, "--set-json", `failurePatterns=[{"name":"our-dataset-mount","category":"Storage","regexp":"dataset shard \\d+ unreadable"}]`)
	cm := find(objs, "ConfigMap", "zaya-system", "zaya-operator-failure-patterns")
	if cm == nil {
		t.Fatal("no failure-patterns ConfigMap")
	}
	data, _, _ := unstructured.NestedString(cm.Object, "data", controllers.FailurePatternsKey)
	table, err := attribution.Parse([]byte(data))
	if err != nil {
		t.Fatalf("the operator would refuse %q: %v", data, err)
	}
	if m, ok := table.Match("dataset shard 7 unreadable"); !ok || m.Pattern != "our-dataset-mount" || m.Category != attribution.Storage {
		t.Errorf("rendered table %q matches %+v", data, m)
	}
	empty := find(mustRender(t), "ConfigMap", "zaya-system", "zaya-operator-failure-patterns")
	data, _, _ = unstructured.NestedString(empty.Object, "data", controllers.FailurePatternsKey)
	if table, err := attribution.Parse([]byte(data)); err != nil || table.Len() != 0 {
		t.Errorf("default %q: %v, %d rules; want an empty table", data, err, table.Len())
	}
	if _, err := render(t, "--set-json", `failurePatterns=[{"name":"x","category":"Cosmic","regexp":"y"}]`); err == nil {
		t.Error("a pattern of an unknown category was installed")
	}
}

// TestChartReadmeListsEveryValue: `helm show readme` prints the README generated from
// values.yaml (make manifests keeps it in sync), and it names every value.
func TestChartReadmeListsEveryValue(t *testing.T) {
	out, err := run(t, tool(t, "helm"), "show", "readme", chartDir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatal(err)
	}
	var missing []string
	var leaves func(prefix string, m map[string]any)
	leaves = func(prefix string, m map[string]any) {
		for k, v := range m {
			if sub, ok := v.(map[string]any); ok && len(sub) > 0 {
				leaves(prefix+k+".", sub)
				continue
			}
			if !strings.Contains(out, "| `"+prefix+k+"` |") {
				missing = append(missing, prefix+k)
			}
		}
	}
	leaves("", values)
	if len(missing) > 0 {
		sort.Strings(missing)
		t.Errorf("helm show readme lacks %v: run make manifests", missing)
	}
	notes, err := os.ReadFile(filepath.Join(chartDir, "templates", "NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(notes), "/main/") {
		t.Error("NOTES.txt points at main: a release's notes must point at its own version")
	}
}

// TestChartCanManageTheCRD: with crds.manage the release carries the generated CRD (so helm
// upgrade upgrades it), kept on uninstall, and the release stays far under the 1 MiB a
// Secret may hold (Helm stores it gzipped, base64 twice).
func TestChartCanManageTheCRD(t *testing.T) {
	out, err := run(t, tool(t, "helm"), "template", "zaya-operator", chartDir, "-n", "zaya-system", "--set", "crds.manage=true")
	if err != nil {
		t.Fatal(err)
	}
	objs := decode(t, out)
	u := find(objs, "CustomResourceDefinition", "", "zayatrainingjobs.training.zaya.dev")
	if u == nil {
		t.Fatalf("crds.manage=true rendered %v: no CRD", kinds(objs))
	}
	got := typed[apiextensionsv1.CustomResourceDefinition](t, u)
	b, err := os.ReadFile(filepath.Join(root, "config", "crd", "bases", "training.zaya.dev_zayatrainingjobs.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var want apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(b, &want); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want.Spec, got.Spec); diff != "" {
		t.Errorf("the templated CRD differs from the generated one (-want +got):\n%s", diff)
	}
	if got.Annotations["helm.sh/resource-policy"] != "keep" || got.Labels["app.kubernetes.io/managed-by"] != "Helm" {
		t.Errorf("CRD metadata %+v: want helm.sh/resource-policy keep (uninstall must not delete every job)", got.ObjectMeta)
	}
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	_, _ = w.Write([]byte(out))
	_ = w.Close()
	if secret := base64.StdEncoding.EncodedLen(base64.StdEncoding.EncodedLen(gz.Len())); secret > 1<<20/2 {
		t.Errorf("the release would take %d bytes of its Secret's 1 MiB: too close", secret)
	}
	if objs := mustRender(t); find(objs, "CustomResourceDefinition", "", "") != nil {
		t.Error("the CRD is a release object by default: helm uninstall would own it")
	}
}

// TestKueueOverlayAndChartInstallTheSameKueueIntegration: config/kueue and the chart with
// kueue.enabled give the operator the flag and the same Kueue rules, and Kueue's controller
// the same access to jobs; without the value the chart grants nothing of Kueue's.
func TestKueueOverlayAndChartInstallTheSameKueueIntegration(t *testing.T) {
	out, err := run(t, tool(t, "kubectl"), "kustomize", filepath.Join(root, "config", "kueue"))
	if err != nil {
		t.Fatal(err)
	}
	kust := decode(t, out)
	chart := mustRender(t, "--set", "kueue.enabled=true")
	for _, objs := range [][]*unstructured.Unstructured{kust, chart} {
		dep := typed[appsv1.Deployment](t, find(objs, "Deployment", "zaya-system", ""))
		if !slices.Contains(dep.Spec.Template.Spec.Containers[0].Args, "--kueue-workloads") {
			t.Errorf("the operator runs without --kueue-workloads: %v", dep.Spec.Template.Spec.Containers[0].Args)
		}
	}
	for _, role := range []struct{ kust, chart string }{{"zaya-operator-kueue-role", "zaya-operator-kueue"}, {"zaya-operator-kueue-access", "zaya-operator-kueue-access"}} {
		krole := typed[rbacv1.ClusterRole](t, find(kust, "ClusterRole", "", role.kust))
		crole := typed[rbacv1.ClusterRole](t, find(chart, "ClusterRole", "", role.chart))
		if diff := cmp.Diff(grants(krole.Rules), grants(crole.Rules), cmp.AllowUnexported(grant{})); diff != "" {
			t.Errorf("%s: kustomize (-) and chart (+) differ:\n%s", role.kust, diff)
		}
	}
	access := typed[rbacv1.ClusterRoleBinding](t, find(chart, "ClusterRoleBinding", "", "zaya-operator-kueue-access"))
	if s := access.Subjects[0]; s.Name != "kueue-controller-manager" || s.Namespace != "kueue-system" {
		t.Errorf("Kueue's access is bound to %s/%s, not Kueue's controller", s.Namespace, s.Name)
	}
	for _, o := range mustRender(t) {
		if strings.Contains(o.GetName(), "kueue") {
			t.Errorf("kueue.enabled=false still renders %s %s", o.GetKind(), o.GetName())
		}
	}
	// The pod integration alone: the rules, not the flag.
	podsOnly := mustRender(t, "--set", "kueue.enabled=true", "--set", "kueue.workloads=false")
	if dep := typed[appsv1.Deployment](t, find(podsOnly, "Deployment", "zaya-system", "")); slices.Contains(dep.Spec.Template.Spec.Containers[0].Args, "--kueue-workloads") {
		t.Error("kueue.workloads=false still runs jobs as Workloads")
	}
	if find(podsOnly, "ClusterRole", "", "zaya-operator-kueue") == nil {
		t.Error("kueue.workloads=false drops the rules the pod integration needs")
	}
}
