//go:build e2e

package chart

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/zaya-operator/zaya-operator/test/nodeagent"
)

const (
	processNode = "zaya.dev/process-node"
	crdName     = "zayatrainingjobs.training.zaya.dev"
	// previousRelease is the commit of the last release, whose chart (previousChartVersion)
	// the upgrade test installs first; move both on at each release.
	previousRelease      = "f0b00d621852d04f8ecfbdce85470967a1462adf"
	previousChartVersion = "0.1.0"
)

// previousChart extracts the previous release's chart from git into a temporary folder.
func previousChart(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("git", "-C", root, "archive", "--format=tar", previousRelease, "charts/zaya-operator")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git archive %s (the previous release; a clone with history is needed): %v", previousRelease, err)
	}
	tr := tar.NewReader(bytes.NewReader(out))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	chart := filepath.Join(dir, "charts", "zaya-operator")
	if b, err := os.ReadFile(filepath.Join(chart, "Chart.yaml")); err != nil || !strings.Contains(string(b), "\nversion: "+previousChartVersion+"\n") {
		t.Fatalf("the chart at %s is not version %s: %v", previousRelease, previousChartVersion, err)
	}
	return chart
}

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
	podUIDs := func(ns string) map[string]string {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		out := map[string]string{}
		for _, p := range pods.Items {
			out[p.Name] = string(p.UID)
		}
		return out
	}

	// The previous release (chart 0.1.0), cluster-scoped, as a platform team installed it:
	// crds/ makes the CRD. --wait returns once the pod passed its readiness probe.
	start := time.Now()
	out, err := helmRun("install", "zaya-operator", previousChart(t), "-n", "zaya-system", "-f", values, "--wait", "--timeout", "3m")
	g.Expect(err).NotTo(HaveOccurred(), "%s\n%s", out, operatorLog())
	t.Logf("helm install --wait (chart %s): %v", previousChartVersion, time.Since(start).Round(time.Millisecond))
	smokeRuns("team-a")
	before := podUIDs("team-a")

	// helm upgrade to this chart, the CRD with it (docs/upgrade.md: adopt, then crds.manage).
	for _, args := range [][]string{
		{"label", "crd", crdName, "app.kubernetes.io/managed-by=Helm", "--overwrite"},
		{"annotate", "crd", crdName, "meta.helm.sh/release-name=zaya-operator", "meta.helm.sh/release-namespace=zaya-system", "--overwrite"},
	} {
		out, err := kubectl(args...)
		g.Expect(err).NotTo(HaveOccurred(), out)
	}
	start = time.Now()
	// The process-backed node shares one host network, and the rolling update runs the new
	// pod beside the old one: it gets ports of its own.
	// metrics.readers binds the scraper's account to read the (secure, by default) metrics.
	out, err = helmRun("upgrade", "zaya-operator", chartDir, "-n", "zaya-system", "-f", values, "--set", "crds.manage=true",
		"--set", "probes.port=18081", "--set", "metrics.port=18080",
		"--set", "metrics.readers[0].namespace=zaya-system", "--set", "metrics.readers[0].name=scraper", "--wait", "--timeout", "3m")
	g.Expect(err).NotTo(HaveOccurred(), "%s\n%s", out, operatorLog())
	t.Logf("helm upgrade --wait (CRD included): %v", time.Since(start).Round(time.Millisecond))
	out, err = kubectl("get", "crd", crdName, "-o", "json")
	g.Expect(err).NotTo(HaveOccurred(), out)
	stored := &apiextensionsv1.CustomResourceDefinition{}
	g.Expect(json.Unmarshal([]byte(out), stored)).To(Succeed())
	g.Expect(stored.Status.Conditions).To(ContainElement(And(HaveField("Type", apiextensionsv1.Established), HaveField("Status", apiextensionsv1.ConditionTrue))))
	want := &apiextensionsv1.CustomResourceDefinition{}
	b, err := os.ReadFile(filepath.Join(chartDir, "crds", "training.zaya.dev_zayatrainingjobs.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(yaml.Unmarshal(b, want)).To(Succeed())
	g.Expect(stored.Spec.Versions).To(HaveLen(len(want.Spec.Versions)))
	plain := func(v any) any { // JSON values (defaults) compared as values, not as text
		b, err := json.Marshal(v)
		g.Expect(err).NotTo(HaveOccurred())
		var out any
		g.Expect(json.Unmarshal(b, &out)).To(Succeed())
		return out
	}
	for i := range want.Spec.Versions {
		g.Expect(cmp.Diff(plain(want.Spec.Versions[i].Schema), plain(stored.Spec.Versions[i].Schema))).To(BeEmpty(), "helm upgrade left the previous CRD's schema")
	}
	// The running job was left alone: still running, on the same pods.
	out, err = kubectl("wait", "-n", "team-a", "--for=condition=Running", "--timeout=30s", "ztj/smoke")
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Consistently(func() map[string]string { return podUIDs("team-a") }, 5, 0.5).Should(Equal(before), "the upgrade replaced a running job's pods")
	// The release, CRD included, is stored far from a Secret's 1 MiB.
	secrets, err := cs.CoreV1().Secrets("zaya-system").List(ctx, metav1.ListOptions{LabelSelector: "owner=helm,name=zaya-operator"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(secrets.Items).To(HaveLen(2))
	for _, s := range secrets.Items {
		t.Logf("release Secret %s: %d bytes", s.Name, len(s.Data["release"]))
		g.Expect(len(s.Data["release"])).To(BeNumerically("<", 512<<10), s.Name)
	}

	// Metrics over HTTPS: a token allowed to get /metrics reads them; no token, or one of an
	// account without the grant, is refused.
	for _, sa := range []string{"scraper", "nobody"} {
		out, err := kubectl("create", "serviceaccount", sa, "-n", "zaya-system")
		g.Expect(err).NotTo(HaveOccurred(), out)
	}
	scrape := func(account string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, "https://127.0.0.1:18080/metrics", nil)
		g.Expect(err).NotTo(HaveOccurred())
		if account != "" {
			token, err := kubectl("create", "token", account, "-n", "zaya-system")
			g.Expect(err).NotTo(HaveOccurred(), token)
			req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(token))
		}
		// The certificate is the operator's own, self-signed: the check here is who may read.
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed by design
		resp, err := c.Do(req)
		g.Expect(err).NotTo(HaveOccurred())
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	g.Eventually(func(g Gomega) {
		code, body := scrape("scraper")
		g.Expect(code).To(Equal(http.StatusOK), body)
		g.Expect(body).To(ContainSubstring("zaya_"))
	}, 30, 1).Should(Succeed())
	code, body := scrape("")
	g.Expect(code).To(Equal(http.StatusUnauthorized), body)
	code, body = scrape("nobody")
	g.Expect(code).To(Equal(http.StatusForbidden), body)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://127.0.0.1:18080/metrics")
	if err == nil {
		_ = resp.Body.Close()
		g.Expect(resp.StatusCode).To(Equal(http.StatusBadRequest), "plain HTTP must not be served")
	}

	// Every sample and the IBM Cloud examples pass the new CRD's validation.
	out, err = kubectl("apply", "--server-side", "--dry-run=server", "-n", "team-a", "-k", filepath.Join(root, "config", "samples"))
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(strings.Count(out, "zayatrainingjob.training.zaya.dev/")).To(Equal(4), out)
	for _, f := range []string{"zaya1.yaml", "zaya1-pollara.yaml"} {
		out, err = kubectl("apply", "--server-side", "--dry-run=server", "-n", "team-a", "-f", filepath.Join(root, "examples", "ibm-cloud", f))
		g.Expect(err).NotTo(HaveOccurred(), out)
	}

	// Uninstalling the operator keeps the CRD (the release owns it now), the job and its pods.
	out, err = helmRun("uninstall", "zaya-operator", "-n", "zaya-system", "--wait", "--timeout", "2m")
	g.Expect(err).NotTo(HaveOccurred(), out)
	out, err = kubectl("get", "crd", crdName, "-o", "name")
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
