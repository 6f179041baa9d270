//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
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
