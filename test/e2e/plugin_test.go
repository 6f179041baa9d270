//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/internal/zayactl"
)

// kubectlZaya runs the plugin against the test's cluster and decodes its JSON into out.
func kubectlZaya(t testing.TB, out any, args ...string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	args = append(args, "--kubeconfig", kubeconfig, "-o", "json")
	if code := zayactl.Main(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Errorf("kubectl zaya %v: exit %d: %s", args, code, stderr.String())
		return
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		t.Errorf("kubectl zaya %v: %v\n%s", args, err, stdout.String())
	}
}

// pluginAgrees checks kubectl zaya against a finished chaos job: why names the roots status
// keeps, with what the operator did, and goodput's totals are status'. ZAYA_CHAOS_TIMELINE
// names a folder to draw each variant's timeline in (docs/observability.md's image).
func pluginAgrees(t testing.TB, final *trainingv1alpha1.ZayaTrainingJob) {
	t.Helper()
	ns, name := final.Namespace, final.Name
	var why zayactl.Why
	kubectlZaya(t, &why, "why", name, "-n", ns)
	if len(why.Failures) != len(final.Status.RecentFailures) {
		t.Errorf("kubectl zaya why tells %d failures, status keeps %d", len(why.Failures), len(final.Status.RecentFailures))
	}
	for i := range min(len(why.Failures), len(final.Status.RecentFailures)) {
		w, f := why.Failures[i], final.Status.RecentFailures[i]
		if ptr.Deref(w.Rank, -1) != ptr.Deref(f.Rank, -1) || w.Category != f.Category || w.Node != f.Node || w.Action != string(f.Action) || w.Action == "" {
			t.Errorf("kubectl zaya why's failure %d: rank %d, %s on %s, action %q; status: rank %d, %s on %s, action %q",
				i, ptr.Deref(w.Rank, -1), w.Category, w.Node, w.Action, ptr.Deref(f.Rank, -1), f.Category, f.Node, f.Action)
		}
	}
	var tl zayactl.Timeline
	kubectlZaya(t, &tl, "goodput", name, "-n", ns)
	if g := final.Status.Goodput; g == nil || tl.WallMilliseconds != g.WallMilliseconds || tl.TrainingMilliseconds != g.TrainingMilliseconds ||
		tl.LostMilliseconds != g.LostMilliseconds || tl.EffectiveTrainingTime != g.EffectiveTrainingTime {
		t.Errorf("kubectl zaya goodput's totals %d/%d/%d ms (%s) are not status.goodput's %+v", tl.WallMilliseconds, tl.TrainingMilliseconds, tl.LostMilliseconds, tl.EffectiveTrainingTime, g)
	}
	losses := 0
	for _, s := range tl.Segments {
		if s.Kind == "Lost" {
			losses++
		}
	}
	if losses < int(final.Status.Restarts) {
		t.Errorf("the timeline shows %d losses for %d restarts", losses, final.Status.Restarts)
	}
	if dir := os.Getenv("ZAYA_CHAOS_TIMELINE"); dir != "" {
		var out bytes.Buffer
		args := []string{"goodput", name, "-n", ns, "--kubeconfig", kubeconfig, "--out", filepath.Join(dir, name+".svg")}
		if code := zayactl.Main(context.Background(), args, &out, &out); code != 0 {
			t.Errorf("drawing the timeline: %s", out.String())
		}
		_ = os.WriteFile(filepath.Join(dir, name+".txt"), out.Bytes(), 0o644)
		for _, cmd := range [][]string{{"why", name}, {"status", name}} {
			out.Reset()
			zayactl.Main(context.Background(), append(cmd, "-n", ns, "--kubeconfig", kubeconfig), &out, &out)
			_ = os.WriteFile(filepath.Join(dir, name+"-"+cmd[0]+".txt"), out.Bytes(), 0o644)
		}
	}
}

// preflightOn runs kubectl zaya preflight in a namespace of the suite's cluster and returns
// its report by check name and its exit code.
func preflightOn(t *testing.T, ns string) (map[string]zayactl.Check, int) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := zayactl.Main(context.Background(), []string{"preflight", "-n", ns, "--kubeconfig", kubeconfig, "-o", "json"}, &stdout, &stderr)
	var p zayactl.Preflight
	if err := json.Unmarshal(stdout.Bytes(), &p); err != nil {
		t.Fatalf("kubectl zaya preflight: exit %d: %v\n%s%s", code, err, stdout.String(), stderr.String())
	}
	checks := map[string]zayactl.Check{}
	for _, c := range p.Checks {
		checks[c.Name] = c
	}
	if p.Ready != (code == 0) {
		t.Errorf("preflight says ready %v and exits %d", p.Ready, code)
	}
	t.Logf("preflight in %s: exit %d\n%s", ns, code, stdout.String())
	return checks, code
}

// TestPreflightReadsTheE2ECluster runs kubectl zaya preflight against the suite's cluster.
// Both clusters serve the CRD, keep restart rules, offer fake MI300X GPUs with NFD's labels
// and admit worker pods. kind's operator is the chart's Deployment: a job can run, exit 0.
// kwok's is a process on this machine, which preflight cannot see: it must say jobs would
// never start and exit 1. A namespace that does not exist fails on both.
func TestPreflightReadsTheE2ECluster(t *testing.T) {
	ns := newNamespace(t)
	checks, code := preflightOn(t, ns)
	want := map[string]string{"CRD": "ok", "In-place restart": "ok", "AMD GPUs": "ok", "Pod Security": "ok", "Operator": "fail"}
	wantCode := 1
	if w.kind() {
		want["Operator"], wantCode = "ok", 0
	}
	for name, result := range want {
		if got := checks[name]; got.Result != result {
			t.Errorf("preflight's %q: %s (%s), want %s", name, got.Result, got.Detail, result)
		}
	}
	if code != wantCode {
		t.Errorf("preflight exits %d, want %d", code, wantCode)
	}

	checks, code = preflightOn(t, ns+"-none")
	if got := checks["Pod Security"]; got.Result != "fail" || code != 1 {
		t.Errorf("in a namespace that does not exist: Pod Security %s (%s), exit %d; want fail, exit 1", got.Result, got.Detail, code)
	}
}

// rootLogs reads a job's last failure's root rank's log with kubectl zaya logs --root after
// the kubelet restarted its killed worker in place: it must choose, by itself, the previous
// container (the run the fault ended) and print what the kubelet keeps of it; --rank reads
// the current run. Only rank 0 logs steps: a rank 1's runs may print the same lines, so the
// choice is checked by the plugin's header and the bytes against the kubelet's own answer.
func rootLogs(t *testing.T, g Gomega, job *trainingv1alpha1.ZayaTrainingJob) {
	t.Helper()
	logs := func(args ...string) (string, string) {
		var stdout, stderr bytes.Buffer
		args = append([]string{"logs", job.Name, "-n", job.Namespace, "--kubeconfig", kubeconfig}, args...)
		code := zayactl.Main(context.Background(), args, &stdout, &stderr)
		g.Expect(code).To(BeZero(), "kubectl zaya %v: %s", args, stderr.String())
		return stdout.String(), stderr.String()
	}
	kubelet := func(pod string, previous bool) string {
		b, err := clients.CoreV1().Pods(job.Namespace).GetLogs(pod, &corev1.PodLogOptions{Container: "worker", Previous: previous}).Do(context.Background()).Raw()
		g.Expect(err).NotTo(HaveOccurred())
		return string(b)
	}
	pod := rankPod(g, job, 1)
	if ws := gang.WorkerStatus(&pod); ws != nil && ws.State.Running != nil && ws.LastTerminationState.Terminated != nil && job.Status.LastFailure != nil {
		t.Logf("rank 1's worker: killed run ended %s, restarted %s (restarts %d); the failure was recorded %s",
			ws.LastTerminationState.Terminated.FinishedAt.Format(time.RFC3339), ws.State.Running.StartedAt.Format(time.RFC3339),
			ws.RestartCount, job.Status.LastFailure.Time.Format(time.RFC3339))
	}
	failed, header := logs("--root")
	g.Expect(header).To(ContainSubstring("pod " + pod.Name + " on " + pod.Spec.NodeName + ", rank 1, previous container"))
	g.Expect(failed).To(Equal(kubelet(pod.Name, true)))
	g.Expect(failed).To(ContainSubstring("zaya-worker: metrics on"), "the killed run's log")
	g.Expect(failed).NotTo(ContainSubstring("zaya-worker: done"))
	current, header := logs("--rank", "1")
	g.Expect(header).To(ContainSubstring("rank 1, current container"))
	g.Expect(kubelet(pod.Name, false)).To(HavePrefix(current))
}
