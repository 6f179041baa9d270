//go:build e2e

package chart

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/zaya-operator/zaya-operator/test/nodeagent"
)

const processNode = "zaya.dev/process-node"

// TestHelmInstallRunsSampleJobs installs the chart as a platform team would (helm install
// --wait into a namespace that enforces Pod Security "restricted") on a cluster whose job
// nodes are kwok's fake MI300X workers. The operator's own pod runs the real binary as a
// process (test/nodeagent) with nothing but its service account's token, so the sample job
// reaching Running proves the chart's RBAC is enough; then a namespace-scoped release
// proves its Roles are, and that it leaves other namespaces alone.
func TestHelmInstallRunsSampleJobs(t *testing.T) {
	g := NewWithT(t)
	kubeconfig, operator := os.Getenv("KUBECONFIG"), os.Getenv("ZAYA_E2E_OPERATOR")
	if kubeconfig == "" || operator == "" {
		t.Fatal("needs KUBECONFIG and ZAYA_E2E_OPERATOR: run it through make test-helm")
	}
	helm, kubectlBin := tool(t, "helm"), tool(t, "kubectl")
	kubectl := func(args ...string) (string, error) {
		return run(t, kubectlBin, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	}
	helmRun := func(args ...string) (string, error) {
		return run(t, helm, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	g.Expect(err).NotTo(HaveOccurred())
	cs, err := kubernetes.NewForConfig(cfg)
	g.Expect(err).NotTo(HaveOccurred())

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	work := t.TempDir()
	_, err = nodeagent.Start(ctx, nodeagent.Options{
		Client: cs, Config: cfg, Nodes: []string{"operator-node"}, WorkDir: work,
		Labels:   map[string]string{processNode: "true"},
		Taints:   []corev1.Taint{{Key: processNode, Value: "true", Effect: corev1.TaintEffectNoSchedule}},
		Commands: map[string]string{"/zaya-operator": operator},
		Logf:     t.Logf,
	})
	g.Expect(err).NotTo(HaveOccurred())

	for _, ns := range []string{"zaya-system", "team-a", "team-b", "team-c"} {
		out, err := kubectl("create", "namespace", ns)
		g.Expect(err).NotTo(HaveOccurred(), out)
	}
	// The operator and the smoke sample's worker pods both pass Pod Security "restricted".
	for _, ns := range []string{"zaya-system", "team-a"} {
		out, err := kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted",
			"pod-security.kubernetes.io/enforce-version=latest")
		g.Expect(err).NotTo(HaveOccurred(), out)
	}

	operatorLog := func() string {
		pods, err := cs.CoreV1().Pods("zaya-system").List(ctx, metav1.ListOptions{})
		if err != nil || len(pods.Items) == 0 {
			return "(no operator pod)"
		}
		var b strings.Builder
		for _, p := range pods.Items {
			b.WriteString(p.Name + ": " + string(p.Status.Phase) + "\n")
		}
		logs, _ := filepath.Glob(filepath.Join(work, "pods", "zaya-system_*", "manager.log"))
		for _, l := range logs {
			data, _ := os.ReadFile(l)
			b.Write(data[max(0, len(data)-4000):])
		}
		return b.String()
	}
	values := filepath.Join("testdata", "local.yaml")

	// Cluster-scoped install; --wait returns once the pod passed its readiness probe.
	start := time.Now()
	out, err := helmRun("install", "zaya-operator", chartDir, "-n", "zaya-system", "-f", values, "--wait", "--timeout", "3m")
	g.Expect(err).NotTo(HaveOccurred(), "%s\n%s", out, operatorLog())
	t.Logf("helm install --wait: %v", time.Since(start).Round(time.Millisecond))
	out, err = kubectl("get", "crd", "zayatrainingjobs.training.zaya.dev", "-o", `jsonpath={.status.conditions[?(@.type=="Established")].status}`)
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).To(Equal("True"))

	// Every sample and the IBM Cloud example pass the API server's validation.
	out, err = kubectl("apply", "--server-side", "--dry-run=server", "-n", "team-a", "-k", filepath.Join(root, "config", "samples"))
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(strings.Count(out, "zayatrainingjob.training.zaya.dev/")).To(Equal(4), out)
	for _, f := range []string{"zaya1.yaml", "zaya1-pollara.yaml"} {
		out, err = kubectl("apply", "--server-side", "--dry-run=server", "-n", "team-a", "-f", filepath.Join(root, "examples", "ibm-cloud", f))
		g.Expect(err).NotTo(HaveOccurred(), out)
	}

	smokeRuns := func(ns string) {
		t.Helper()
		out, err := kubectl("apply", "--server-side", "-n", ns, "-f", filepath.Join(root, "config", "samples", "smoke.yaml"))
		g.Expect(err).NotTo(HaveOccurred(), out)
		out, err = kubectl("wait", "-n", ns, "--for=condition=Running", "--timeout=90s", "ztj/smoke")
		g.Expect(err).NotTo(HaveOccurred(), "%s\n%s", out, operatorLog())
		// The operator's events reached the API: its events RBAC works too.
		g.Eventually(func() string {
			out, _ := kubectl("get", "events", "-n", ns, "--field-selector", "involvedObject.name=smoke", "-o", "name")
			return out
		}, 30, 0.5).ShouldNot(BeEmpty())
	}
	smokeRuns("team-a")

	// Uninstalling the operator keeps the CRD, the job and its pods.
	out, err = helmRun("uninstall", "zaya-operator", "-n", "zaya-system", "--wait", "--timeout", "2m")
	g.Expect(err).NotTo(HaveOccurred(), out)
	out, err = kubectl("get", "-n", "team-a", "ztj/smoke", "-o", "name")
	g.Expect(err).NotTo(HaveOccurred(), out)
	pods, err := cs.CoreV1().Pods("team-a").List(ctx, metav1.ListOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(pods.Items).To(HaveLen(2))

	// A team's own namespace-scoped release: Roles in team-b only.
	out, err = helmRun("install", "team-b-operator", chartDir, "-n", "zaya-system", "-f", values,
		"--set", "rbac.scope=Namespace", "--set", "watchNamespaces={team-b}", "--wait", "--timeout", "3m")
	g.Expect(err).NotTo(HaveOccurred(), "%s\n%s", out, operatorLog())
	smokeRuns("team-b")
	out, err = kubectl("apply", "--server-side", "-n", "team-c", "-f", filepath.Join(root, "config", "samples", "smoke.yaml"))
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Consistently(func() string {
		out, _ := kubectl("get", "-n", "team-c", "ztj/smoke", "-o", "jsonpath={.status.conditions}")
		return out
	}, 5, 0.5).Should(BeEmpty(), "an operator scoped to team-b reconciled a job in team-c")
	out, err = helmRun("uninstall", "team-b-operator", "-n", "zaya-system", "--wait", "--timeout", "2m")
	g.Expect(err).NotTo(HaveOccurred(), out)
}
