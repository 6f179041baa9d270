package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
	"github.com/zaya-operator/zaya-operator/internal/zayactl"
)

// kubeconfig writes a kubeconfig of the test's API server, as a user would have one.
func kubeconfig(t *testing.T) string {
	t.Helper()
	c := clientcmdapi.NewConfig()
	c.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	c.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	c.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin", Namespace: "default"}
	c.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*c, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// kubectlZaya runs the plugin and decodes its JSON output into out.
func kubectlZaya(t *testing.T, out any, args ...string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := zayactl.Main(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("kubectl zaya %v: exit %d: %s", args, code, stderr.String())
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		t.Fatalf("kubectl zaya %v: %v\n%s", args, err, stdout.String())
	}
}

// The plugin tells what the operator recorded: status shows the gang the operator runs, why
// names the same root as status, goodput's totals are status'.
func TestKubectlZayaTellsWhatTheOperatorRecorded(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	explainOnFailure(t, ns, "llm")
	startManager(t)

	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).RestartMode(trainingv1alpha1.RestartModeRecreate).Obj()
	pods := runGang(g, job, 2)
	setPodStatus(g, pods["llm-0-1"], failedWith(1))
	g.Eventually(func(g Gomega) {
		pods = jobPods(g, ns, "llm")
		g.Expect(pods).To(HaveKey("llm-1-0"))
		g.Expect(pods).To(HaveKey("llm-1-1"))
	}, timeout, interval).Should(Succeed())
	setPodStatus(g, pods["llm-1-0"], runningReady)
	setPodStatus(g, pods["llm-1-1"], runningReady)
	var stored *trainingv1alpha1.ZayaTrainingJob
	g.Eventually(func(g Gomega) {
		stored = getJob(g, job)
		g.Expect(meta.FindStatusCondition(stored.Status.Conditions, trainingv1alpha1.ConditionRestarting).Reason).To(Equal(trainingv1alpha1.ReasonRecovered))
		g.Expect(stored.Status.Goodput).NotTo(BeNil())
		g.Expect(stored.Status.Goodput.History).NotTo(BeEmpty()) // the start closed, at least
	}, timeout, interval).Should(Succeed())

	flags := []string{"--kubeconfig", kubeconfig(t), "-n", ns, "-o", "json"}
	var st zayactl.Status
	kubectlZaya(t, &st, append([]string{"status", "llm"}, flags...)...)
	g.Expect(st.Job).To(Equal(ns + "/llm"))
	g.Expect(st.State).To(Equal(trainingv1alpha1.ConditionRunning))
	g.Expect(st.Attempt).To(Equal(int32(1)))
	g.Expect(st.Restarts).To(Equal(stored.Status.Restarts))
	g.Expect(st.Ranks).To(HaveLen(2))
	for r, rank := range st.Ranks {
		g.Expect(rank.Pod).To(Equal(fmt.Sprintf("llm-1-%d", r)), "the current attempt's pods, not the failed one kept for its logs")
		g.Expect(rank.Ready).To(BeTrue())
	}

	var why zayactl.Why
	kubectlZaya(t, &why, append([]string{"why", "llm"}, flags...)...)
	g.Expect(why.Failures).To(HaveLen(len(stored.Status.RecentFailures)))
	root := why.Failures[0]
	g.Expect(root.Rank).To(Equal(ptr.To[int32](1)))
	g.Expect(root.Rank).To(Equal(stored.Status.LastFailure.Rank))
	g.Expect(root.Category).To(Equal(stored.Status.LastFailure.Category))
	g.Expect(root.Action).To(Equal(string(trainingv1alpha1.FailureActionRecreated)))

	var tl zayactl.Timeline
	kubectlZaya(t, &tl, append([]string{"goodput", "llm"}, flags...)...)
	gp := getJob(g, job).Status.Goodput
	g.Expect(tl.WallMilliseconds).To(Equal(gp.WallMilliseconds))
	g.Expect(tl.TrainingMilliseconds).To(Equal(gp.TrainingMilliseconds))
	g.Expect(tl.LostMilliseconds).To(Equal(gp.LostMilliseconds))
	kinds := []string{}
	for _, s := range tl.Segments {
		kinds = append(kinds, s.Kind)
	}
	// Queued for less than the second startTime keeps, perhaps: then no Queued at all.
	if kinds[0] == "Queued" {
		kinds = kinds[1:]
	}
	g.Expect(kinds).To(HaveExactElements("Startup", "Training", "Lost", "Training"), "the start, training, the failure's loss, training again")

	// A job that is not there, and an output nobody knows, fail with a word and an exit code.
	var stdout, stderr bytes.Buffer
	g.Expect(zayactl.Main(context.Background(), append([]string{"status", "nope"}, flags...), &stdout, &stderr)).To(Equal(1))
	g.Expect(stderr.String()).To(ContainSubstring("not found"))
	stderr.Reset()
	g.Expect(zayactl.Main(context.Background(), []string{"why", "llm", "--kubeconfig", flags[1], "-n", ns, "-o", "xml"}, &stdout, &stderr)).To(Equal(1))
	g.Expect(stderr.String()).To(ContainSubstring(`--output "xml"`))
}
