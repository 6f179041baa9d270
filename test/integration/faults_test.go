package integration

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/flakyapi"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// faultSeed is ZAYA_FAULT_SEED, or a fixed seed so a failure can be replayed.
func faultSeed(t *testing.T) uint64 {
	if s := os.Getenv("ZAYA_FAULT_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("ZAYA_FAULT_SEED: %v", err)
		}
		return n
	}
	return 8
}

// TestJobSurvivesAFaultyAPIServer runs a job that recreates its gang through a node loss, a worker crash and success
// while every request of the operator goes through a proxy that throttles, fails, loses the
// answers of writes it made and cuts watches, and its client's writes conflict or lose their
// answers too. It checks what must hold whatever the timing: no attempt starts while an
// older one still has pods, no pod is made twice, every failure restarts the gang exactly once,
// a quarantine once recorded stays, and the job gets to Succeeded.
func TestJobSurvivesAFaultyAPIServer(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	seed := faultSeed(t)
	t.Logf("ZAYA_FAULT_SEED=%d", seed)

	// Faults start once the manager is built: a failed discovery at start-up ends the process
	// (and the kubelet restarts it), which is not what this test is about.
	proxy, err := flakyapi.Start(cfg, flakyapi.Faults{}, seed)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(proxy.Close)
	writes := flakyapi.NewInterceptor(flakyapi.ClientFaults{}, seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("faults the proxy made: %v; the client: %v", proxy.Counts(), writes.Counts())
		}
	})
	startManagerWith(t, proxy.Config(), func(c *rest.Config, o client.Options) (client.Client, error) {
		wc, err := client.NewWithWatch(c, o)
		if err != nil {
			return nil, err
		}
		return writes.Wrap(wc), nil
	})
	proxy.SetFaults(flakyapi.Faults{
		Throttle: 0.05, ServerError: 0.1, LostResponse: 0.1, Gone: 0.1,
		Latency: 20 * time.Millisecond, WatchCut: 4 * time.Second,
	})
	writes.SetFaults(flakyapi.ClientFaults{Conflict: 0.15, AfterCommit: 0.15})

	nodes := make([]string, 3)
	for i := range nodes {
		nodes[i] = makeReadyNode(g, fmt.Sprintf("%s-n%d", ns, i))
		t.Cleanup(func() {
			_ = k8sClient.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodes[i]}})
		})
	}
	inv := watchInvariants(t, ns, "llm", 2)
	explainOnFailure(t, ns, "llm")

	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).NewCheckpoint("10Gi", "").Obj()
	ft := &job.Spec.FaultTolerance
	ft.RestartMode = trainingv1alpha1.RestartModeRecreate // every fault makes a new attempt's gang
	ft.Quarantine.NodeTaint = trainingv1alpha1.QuarantineTaintNoSchedule
	ft.TerminatingTimeout = &metav1.Duration{Duration: time.Second}
	job.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](1)
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())

	const slow = 60 * time.Second // faults make every step take several tries
	// runAttempt plays scheduler and kubelet for the attempt's pods once all exist.
	runAttempt := func(attempt int, on ...string) {
		t.Helper()
		var pods map[string]*corev1.Pod
		g.Eventually(func(g Gomega) {
			pods = jobPods(g, ns, "llm")
			for r := range on {
				g.Expect(pods).To(HaveKey(fmt.Sprintf("llm-%d-%d", attempt, r)))
			}
		}, slow, interval).Should(Succeed(), "attempt %d was not created", attempt)
		for r, node := range on {
			bindAndRun(g, pods[fmt.Sprintf("llm-%d-%d", attempt, r)], node)
		}
		g.Eventually(func(g Gomega) {
			got := getJob(g, job)
			g.Expect(got.Status.Restarts).To(Equal(int32(attempt)))
			g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionRunning)).To(BeTrue())
		}, slow, interval).Should(Succeed(), "attempt %d did not run", attempt)
	}

	runAttempt(0, nodes[0], nodes[1])

	// n1 stops reporting: quarantined and tainted, the gang restarts on n0 and n2.
	n1 := &corev1.Node{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: nodes[1]}, n1)).To(Succeed())
	n1.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown"}}
	g.Expect(k8sClient.Status().Update(ctx, n1)).To(Succeed())
	runAttempt(1, nodes[0], nodes[2])
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: nodes[1]}, n1)).To(Succeed())
	g.Expect(n1.Spec.Taints).To(ContainElement(HaveField("Key", trainingv1alpha1.QuarantineTaintKey)))

	// A worker crashes: one more restart.
	pods := jobPods(g, ns, "llm")
	setPodStatus(g, pods["llm-1-1"], failedWith(1))
	runAttempt(2, nodes[0], nodes[2])

	pods = jobPods(g, ns, "llm")
	setPodStatus(g, pods["llm-2-0"], corev1.PodStatus{Phase: corev1.PodSucceeded, ContainerStatuses: []corev1.ContainerStatus{{
		Name: "worker", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}},
	}}})
	g.Eventually(func(g Gomega) {
		got := getJob(g, job)
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionSucceeded)).To(BeTrue())
	}, slow, interval).Should(Succeed())

	got := getJob(g, job)
	g.Expect(got.Status.Restarts).To(Equal(int32(2)), "a restart was counted twice or lost")
	g.Expect(got.Status.RestartTimes).To(HaveLen(2))
	g.Expect(got.Status.QuarantinedNodes).To(ConsistOf(HaveField("Name", nodes[1])))
	for name, p := range jobPods(g, ns, "llm") {
		if p.Labels[trainingv1alpha1.AttemptLabel] != "0" {
			g.Expect(p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchFields).
				To(ContainElement(HaveField("Values", []string{nodes[1]})), "pod %s may land on the quarantined node", name)
		}
	}
	g.Expect(inv.stop()).To(BeEmpty())

	// The faults happened: the proxy and the interceptor both misbehaved, in every way.
	pc, wc := proxy.Counts(), writes.Counts()
	t.Logf("proxy: %v; client writes: %v", pc, wc)
	for _, k := range []flakyapi.Kind{flakyapi.Throttled, flakyapi.ServerErrors, flakyapi.LostReplies, flakyapi.GoneWatches, flakyapi.CutWatches} {
		g.Expect(pc[k]).To(BeNumerically(">", 0), "the proxy never injected %s", k)
	}
	for _, k := range []flakyapi.Kind{flakyapi.Conflicts, flakyapi.AfterCommit} {
		g.Expect(wc[k]).To(BeNumerically(">", 0), "the client never injected %s", k)
	}
}

// makeReadyNode creates a schedulable Ready node (envtest has no kubelet to report one).
func makeReadyNode(g Gomega, name string) string {
	ctx := context.Background()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	g.Expect(k8sClient.Create(ctx, n)).To(Succeed())
	n.Spec.Taints = nil // admission adds not-ready until a kubelet reports
	g.Expect(k8sClient.Update(ctx, n)).To(Succeed())
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	g.Expect(k8sClient.Status().Update(ctx, n)).To(Succeed())
	return name
}

// bindAndRun plays scheduler and kubelet: the pod lands on node and is running and ready.
func bindAndRun(g Gomega, p *corev1.Pod, node string) {
	ctx := context.Background()
	g.Expect(k8sClient.SubResource("binding").Create(ctx, p, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	})).To(Succeed())
	g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(p), p)).To(Succeed())
	setPodStatus(g, p, runningReady)
}

// invariants watches a job and its pods (without faults) and records every violation of what
// must hold at all times.
type invariants struct {
	mu         sync.Mutex
	violations []string
	cancel     context.CancelFunc
	done       sync.WaitGroup
}

func (v *invariants) fail(format string, args ...any) {
	v.mu.Lock()
	v.violations = append(v.violations, fmt.Sprintf(format, args...))
	v.mu.Unlock()
}

// stop ends the watches and returns the violations seen.
func (v *invariants) stop() []string {
	v.cancel()
	v.done.Wait()
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.violations
}

// watchInvariants checks, on every change: each pod name is created once (no duplicate pods);
// when a pod of attempt k appears, no pod of an older attempt is still alive (running,
// pending or terminating; a failed one kept for its logs is fine); at most `nodes` pods per
// attempt; status.restarts never goes back or jumps; a quarantined node stays quarantined.
func watchInvariants(t *testing.T, ns, job string, nodes int) *invariants {
	t.Helper()
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatalf("watch client: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	v := &invariants{cancel: cancel}
	podWatch, err := wc.Watch(ctx, &corev1.PodList{}, client.InNamespace(ns), client.MatchingLabels{trainingv1alpha1.JobNameLabel: job})
	if err != nil {
		t.Fatalf("watching pods: %v", err)
	}
	jobWatch, err := wc.Watch(ctx, &trainingv1alpha1.ZayaTrainingJobList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatalf("watching jobs: %v", err)
	}
	t.Cleanup(func() { v.stop() })

	v.done.Add(2)
	go func() {
		defer v.done.Done()
		uids := map[string]types.UID{}
		live := map[string]*corev1.Pod{}
		perAttempt := map[string]int{}
		for ev := range podWatch.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			attempt := p.Labels[trainingv1alpha1.AttemptLabel]
			switch ev.Type {
			case watch.Added:
				if old, seen := uids[p.Name]; seen && old != p.UID {
					v.fail("pod %s was created twice", p.Name)
				}
				uids[p.Name] = p.UID
				if perAttempt[attempt]++; perAttempt[attempt] > nodes {
					v.fail("attempt %s has %d pods", attempt, perAttempt[attempt])
				}
				a, _ := strconv.Atoi(attempt)
				for _, o := range live {
					oa, _ := strconv.Atoi(o.Labels[trainingv1alpha1.AttemptLabel])
					if oa < a && !terminal(o) {
						v.fail("pod %s of attempt %d created while %s of attempt %d was still %s", p.Name, a, o.Name, oa, o.Status.Phase)
					}
				}
				live[p.Name] = p
			case watch.Modified:
				live[p.Name] = p
			case watch.Deleted:
				delete(live, p.Name)
			}
		}
	}()
	go func() {
		defer v.done.Done()
		var restarts int32
		quarantined := map[string]bool{}
		for ev := range jobWatch.ResultChan() {
			j, ok := ev.Object.(*trainingv1alpha1.ZayaTrainingJob)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			if r := j.Status.Restarts; r < restarts || r > restarts+1 {
				v.fail("status.restarts went from %d to %d", restarts, r)
			} else {
				restarts = r
			}
			now := map[string]bool{}
			for _, q := range j.Status.QuarantinedNodes {
				now[q.Name] = true
			}
			for n := range quarantined {
				if !now[n] {
					v.fail("node %s left the quarantine list", n)
				}
			}
			for n := range now {
				quarantined[n] = true
			}
		}
	}()
	return v
}

// terminal: the pod's containers are done (a failed rank is kept for its logs).
func terminal(p *corev1.Pod) bool {
	return slices.Contains([]corev1.PodPhase{corev1.PodSucceeded, corev1.PodFailed}, p.Status.Phase)
}

// TestAStatusConflictWithNoNewerVersionIsLookedAtAgain refuses the write of a restart decision
// with a 409 that no newer version follows (as a webhook or a proxy may): no event would bring
// the next pass, so the operator must look again by itself, not wait for an unrelated change.
func TestAStatusConflictWithNoNewerVersionIsLookedAtAgain(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	var refuse atomic.Int32 // status writes of the job still to refuse
	startManagerWith(t, cfg, func(c *rest.Config, o client.Options) (client.Client, error) {
		wc, err := client.NewWithWatch(c, o)
		if err != nil {
			return nil, err
		}
		return interceptor.NewClient(wc, interceptor.Funcs{
			SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
				if _, isJob := obj.(*trainingv1alpha1.ZayaTrainingJob); isJob && sub == "status" && refuse.Add(-1) >= 0 {
					return apierrors.NewConflict(schema.GroupResource{Group: trainingv1alpha1.GroupVersion.Group, Resource: "zayatrainingjobs"},
						obj.GetName(), fmt.Errorf("refused by the test"))
				}
				return c.SubResource(sub).Update(ctx, obj, opts...)
			},
		}), nil
	})
	explainOnFailure(t, ns, "llm")

	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).Obj()
	job.Spec.FaultTolerance.RestartMode = trainingv1alpha1.RestartModeRecreate
	pods := runGang(g, job, 2)

	refuse.Store(1)
	setPodStatus(g, pods["llm-0-1"], failedWith(1))
	g.Eventually(func(g Gomega) {
		g.Expect(refuse.Load()).To(BeNumerically("<", 0), "the decision's write was not refused")
		g.Expect(getJob(g, job).Status.Restarts).To(Equal(int32(1)))
	}, timeout, interval).Should(Succeed(), "the restart decided in the refused write was never written")
}
