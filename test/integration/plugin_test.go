package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
	"github.com/zaya-operator/zaya-operator/internal/zayactl"
)

// recreatedOnce runs a 2-rank job "llm" whose rank 1 fails, until the gang the operator made
// again runs.
func recreatedOnce(g Gomega, ns string) *trainingv1alpha1.ZayaTrainingJob {
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
	return job
}

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

	job := recreatedOnce(g, ns)
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

// preflight passes on a cluster that has what jobs need, and fails on one whose API server
// drops container restart rules: this suite's API server keeps them, the oldest supported
// one's (make test-min-kube) does not, and the verdict follows the API server's own answer.
func TestPreflightFollowsTheClustersAnswers(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	opNS := newNamespace(t)
	// What a real cluster has and envtest does not: GPU nodes, the operator, a file class.
	for _, name := range []string{"mi300x-0", "mi300x-1"} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"feature.node.kubernetes.io/amd-gpu": "true"}}}
		g.Expect(k8sClient.Create(ctx, node)).To(Succeed())
		t.Cleanup(func() { _ = k8sClient.Delete(ctx, node) })
		node.Status.Allocatable = corev1.ResourceList{"amd.com/gpu": resource.MustParse("8"), "amd.com/nic": resource.MustParse("8")}
		node.Status.Capacity = node.Status.Allocatable
		g.Expect(k8sClient.Status().Update(ctx, node)).To(Succeed())
	}
	labels := map[string]string{"app.kubernetes.io/name": "zaya-operator"}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "zaya-operator", Namespace: opNS, Labels: labels},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "manager", Image: "zaya-operator:dev"}}}}}}
	g.Expect(k8sClient.Create(ctx, dep)).To(Succeed())
	dep.Status.Replicas, dep.Status.ReadyReplicas = 1, 1
	g.Expect(k8sClient.Status().Update(ctx, dep)).To(Succeed())
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "zaya-preflight-file"}, Provisioner: "nfs.csi.k8s.io"}
	g.Expect(k8sClient.Create(ctx, class)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(ctx, class) })

	// A rank whose worker a default kubelet restarted a second time 12 s after its exit.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "llm-0-1", Namespace: ns, Labels: map[string]string{trainingv1alpha1.JobNameLabel: "llm"}},
		Spec: corev1.PodSpec{NodeName: "mi300x-1", Containers: []corev1.Container{{Name: "worker", Image: "zaya-worker:dev"}}}}
	g.Expect(k8sClient.Create(ctx, pod)).To(Succeed())
	exit := metav1.Now().Rfc3339Copy()
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "worker", Image: "zaya-worker:dev", ImageID: "zaya-worker", RestartCount: 2,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(exit.Add(12 * time.Second))}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 75,
			StartedAt: metav1.NewTime(exit.Add(-time.Minute)), FinishedAt: exit}}}}
	g.Expect(k8sClient.Status().Update(ctx, pod)).To(Succeed())

	probe := recovery.RulesProbe(ns)
	err := k8sClient.Create(ctx, probe, client.DryRunAll)
	kept := err == nil && recovery.RulesKept(probe)
	g.Expect(err == nil || recovery.RefusesRestartRules(err)).To(BeTrue(), "the probe: %v", err)
	t.Logf("the API server keeps container restart rules: %v", kept)

	var stdout, stderr bytes.Buffer
	code := zayactl.Main(ctx, []string{"preflight", "--kubeconfig", kubeconfig(t), "-n", ns, "-o", "json"}, &stdout, &stderr)
	var p zayactl.Preflight
	g.Expect(json.Unmarshal(stdout.Bytes(), &p)).To(Succeed(), stdout.String())
	results := map[string]string{}
	for _, c := range p.Checks {
		results[c.Name] = c.Result
	}
	g.Expect(results).To(HaveKeyWithValue("CRD", "ok"))
	g.Expect(results).To(HaveKeyWithValue("Operator", "ok"))
	g.Expect(results).To(HaveKeyWithValue("AMD GPUs", "ok"))
	g.Expect(results).To(HaveKeyWithValue("AMD NICs", "ok"))
	g.Expect(results).To(HaveKeyWithValue("Checkpoint storage", "ok"))
	g.Expect(results).To(HaveKeyWithValue("Pod Security", "ok"))
	g.Expect(results).To(HaveKeyWithValue("Restart back-off", "warn"), "the pod's restart 12 s after its exit is a default kubelet's back-off")
	if kept {
		g.Expect(results).To(HaveKeyWithValue("In-place restart", "ok"))
		g.Expect(code).To(Equal(0), "%s\n%s", stdout.String(), stderr.String())
		g.Expect(p.Ready).To(BeTrue())
	} else {
		g.Expect(results).To(HaveKeyWithValue("In-place restart", "fail"))
		g.Expect(code).To(Equal(1))
		g.Expect(stderr.String()).To(ContainSubstring("a job could not run here"))
	}
}
