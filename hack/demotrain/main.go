// Command demotrain is the second half of make demo: the reference worker really trains as a
// 4-node job on process-backed MI300X nodes (test/nodeagent). A worker is killed on purpose
// (the gang restarts in place, no pod replaced), then a node hangs (only its rank's pod is
// replaced, away from it, while the others restart in place); each time training resumes
// from the last checkpoint, and the demo prints how long that took. Last, the job (elastic,
// minNodes 2) loses a node while no other node is free: it shrinks to 3 nodes, and grows
// back to 4 at its next checkpoint once a node stands ready again.
// It needs KUBECONFIG (a cluster with the CRD and the operator running) and -worker.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
	"github.com/zaya-operator/zaya-operator/test/nodeagent"
	"github.com/zaya-operator/zaya-operator/workers/train"
)

const (
	ns, name, label = "default", "train", "zaya.dev/process-node"
	steps, every    = 900, 20
)

func main() {
	worker := flag.String("worker", "bin/zaya-worker", "the zaya-worker binary")
	workdir := flag.String("workdir", "bin/demo-nodes", "where the process-backed nodes keep pods and volumes")
	proxy := flag.String("proxy", "", "serve the nodes' pod-network proxy here (the operator's --worker-proxy)")
	flag.Parse()
	if *proxy != "" {
		srv := &http.Server{Addr: *proxy, Handler: nodeagent.PodNetworkProxy(), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.ListenAndServe() }()
	}
	if err := run(*worker, *workdir); err != nil {
		fmt.Fprintln(os.Stderr, "demotrain:", err)
		os.Exit(1)
	}
}

func run(worker, workdir string) error {
	ctx := context.Background()
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(trainingv1alpha1.AddToScheme(scheme))
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	worker, _ = filepath.Abs(worker)
	_ = os.RemoveAll(workdir)
	nodes := []string{"proc-0", "proc-1", "proc-2", "proc-3", "proc-4", "proc-5"}
	actx, stop := context.WithCancel(ctx)
	defer stop()
	a, err := nodeagent.Start(actx, nodeagent.Options{
		Client: cs, Nodes: nodes, WorkDir: workdir, Commands: map[string]string{"zaya-worker": worker},
		Labels: map[string]string{label: "true"},
		Taints: []corev1.Taint{{Key: label, Value: "true", Effect: corev1.TaintEffectNoSchedule}},
		// Kubelets set up for in-place restarts (crashLoopBackOff.maxContainerRestartPeriod:
		// 1s, KEP-4603): a default one waits 10 s before a container's second restart in 10 min.
		MaxContainerRestartPeriod: time.Second,
	})
	if err != nil {
		return err
	}
	fmt.Printf("6 process-backed MI300X nodes (%s): each pod bound to them runs as a local process\n", strings.Join(nodes, ", "))

	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "demo-train-checkpoints"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			ClaimRef:               &corev1.ObjectReference{Namespace: ns, Name: "train-checkpoints"},
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/tmp/demo-train"}},
		},
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "train-checkpoints", Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}, StorageClassName: ptr.To(""), VolumeName: pv.Name,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	for _, o := range []client.Object{pv, pvc} {
		if err := c.Create(ctx, o); err != nil {
			return err
		}
	}

	job := testjob.MakeZayaTrainingJob(name, ns).Nodes(4).GPUsPerNode(2).ContextParallel(2).
		Profile(trainingv1alpha1.NetworkSocket).ClaimCheckpoint(pvc.Name).Obj()
	job.Spec.Checkpoint.Interval = &trainingv1alpha1.CheckpointInterval{Steps: ptr.To[int32](every)}
	ft := &job.Spec.FaultTolerance
	ft.Backoff.Initial, ft.Backoff.Max = &metav1.Duration{Duration: time.Second}, &metav1.Duration{Duration: 2 * time.Second}
	ft.TerminatingTimeout = &metav1.Duration{Duration: 5 * time.Second}
	ps := &job.Spec.Template.Spec
	ps.NodeSelector = map[string]string{label: "true"}
	ps.Tolerations = []corev1.Toleration{{Key: label, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	ps.TerminationGracePeriodSeconds = ptr.To[int64](3)
	w := &ps.Containers[0]
	w.Command = []string{"zaya-worker"}
	w.Args = []string{fmt.Sprintf("-steps=%d", steps), "-seq=16", "-dim=6", "-pace=40ms", "-log-every=10", "-metrics-addr=$(POD_IP):9400", "-master-listen=$(POD_IP):29500"}
	w.Env = append(w.Env, corev1.EnvVar{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}})
	job.Spec.Elastic = &trainingv1alpha1.ElasticSpec{MinNodes: 2,
		ShrinkAfter: &metav1.Duration{Duration: 10 * time.Second}, GrowAfter: &metav1.Duration{Duration: 10 * time.Second}}
	if err := c.Create(ctx, job); err != nil {
		return err
	}
	fmt.Printf("created ZayaTrainingJob %s: 4 nodes x 2 ranks, context parallel 2, checkpoint every %d steps, %d steps, elastic down to 2 nodes\n\n", name, every, steps)

	get := func() *trainingv1alpha1.ZayaTrainingJob {
		j := &trainingv1alpha1.ZayaTrainingJob{}
		_ = c.Get(ctx, client.ObjectKeyFromObject(job), j)
		return j
	}
	logOf := func(attempt int32) string {
		dir := a.PodDir(ns, fmt.Sprintf("%s-%d-0", name, attempt))
		b, _ := os.ReadFile(filepath.Join(dir, "worker.log"))
		return string(b)
	}
	printed := map[int32]int{} // lines of each attempt's rank-0 log already shown
	follow := func(attempt int32) {
		lines := strings.Split(logOf(attempt), "\n")
		for _, l := range lines[min(printed[attempt], len(lines)):] {
			if strings.HasPrefix(l, "step ") || strings.HasPrefix(l, "resumed") || strings.HasPrefix(l, "checkpoint step") {
				if i := strings.LastIndex(l, " at "); i > 0 && len(l) >= i+27 {
					l = l[:i] + " at " + l[i+15:i+27] // the step's time, hh:mm:ss.mmm
				}
				fmt.Printf("  [attempt %d, rank 0] %s\n", attempt, l)
			}
		}
		printed[attempt] = max(len(lines)-1, 0) // the last one may be half written
	}
	podUIDs := func() map[string]string {
		pods := &corev1.PodList{}
		_ = c.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{trainingv1alpha1.JobNameLabel: name})
		out := map[string]string{}
		for _, p := range pods.Items {
			if p.DeletionTimestamp.IsZero() {
				out[p.Name] = string(p.UID)
			}
		}
		return out
	}
	var (
		killedAt, failedAt int64
		killedPods         map[string]string
		inPlaceSecs        int32 = -1
		inPlaceReplaced    int
		failedNode         string
		killed, frozen     time.Time
		resumedBefore      int           // rank 0's "resumed" lines when the node froze
		killAdvance        time.Duration // fault to rank 0 training again
		freezeAdvance      time.Duration
		lostNode, freeNode string // the elastic phase: the node lost, and the one held back
		lostAt             int64
		lost, uncordoned   time.Time
		shrinkAdvance      time.Duration // the node lost to training on 3 nodes
		growRunning        time.Duration // the node back to training on 4 again
		grewAt             int64
	)
	// advancing: rank 0 resumed more often than `before` times and trained a step since.
	advancing := func(log string, before int) bool {
		if strings.Count(log, "\nresumed from step ") <= before {
			return false
		}
		return strings.Contains(log[strings.LastIndex(log, "\nresumed from step "):], "\nstep ")
	}
	deadline := time.Now().Add(6 * time.Minute)
	for time.Now().Before(deadline) {
		j := get()
		att := j.Status.Attempt()
		follow(att)
		if att > 0 {
			follow(att - 1)
		}
		if meta.IsStatusConditionTrue(j.Status.Conditions, trainingv1alpha1.ConditionSucceeded) ||
			meta.IsStatusConditionTrue(j.Status.Conditions, trainingv1alpha1.ConditionFailed) {
			break
		}
		last := train.ParseLog(logOf(att)).Last
		recovered := meta.IsStatusConditionTrue(j.Status.Conditions, trainingv1alpha1.ConditionRunning)
		switch {
		case killedAt == 0 && att == 0 && strings.Contains(logOf(0), "checkpoint step 40 committed") && last >= 50:
			killedAt, killedPods = last, podUIDs()
			resumedBefore = strings.Count(logOf(0), "\nresumed from step ")
			fmt.Printf("\n>>> killing rank 1's worker process on purpose (a process fault on a healthy node)\n\n")
			killed = time.Now()
			if err := a.Signal(ns, fmt.Sprintf("%s-0-1", name), syscall.SIGKILL); err != nil {
				return err
			}
		case !killed.IsZero() && killAdvance == 0 && advancing(logOf(0), resumedBefore):
			killAdvance = time.Since(killed)
		case killedAt > 0 && inPlaceSecs < 0 && j.Status.Restarts == 1 && recovered && j.Status.LastRecoverySeconds != nil:
			inPlaceSecs = *j.Status.LastRecoverySeconds
			now := podUIDs()
			for pod, uid := range killedPods {
				if now[pod] != uid {
					inPlaceReplaced++
				}
			}
			fmt.Printf("\n>>> restarted in place in %ds: %d of %d pods replaced\n\n", inPlaceSecs, inPlaceReplaced, len(killedPods))
		case inPlaceSecs >= 0 && killAdvance > 0 && failedNode == "" && last >= 150:
			victim := fmt.Sprintf("%s-%d-2", name, att)
			failedNode, failedAt = a.NodeOf(ns, victim), last
			resumedBefore = strings.Count(logOf(att), "\nresumed from step ")
			fmt.Printf("\n>>> node %s (rank 2's node) hangs on purpose: its processes freeze, its kubelet stops renewing its Lease; nothing marks it NotReady\n\n", failedNode)
			frozen = time.Now()
			if err := a.Freeze(failedNode); err != nil {
				return err
			}
		case !frozen.IsZero() && freezeAdvance == 0 && advancing(logOf(att), resumedBefore):
			freezeAdvance = time.Since(frozen)
			fmt.Printf("\n>>> training advancing again %.1fs after the node froze: %d of %d pods replaced\n\n",
				freezeAdvance.Seconds(), replacedSince(podUIDs(), killedPods), len(killedPods))
		case freezeAdvance > 0 && lostNode == "" && last >= 300:
			used := nodesOf(ctx, c, att)
			for _, n := range nodes {
				if n != failedNode && !slices.Contains(used, n) {
					freeNode = n
				}
			}
			lostNode, lostAt = a.NodeOf(ns, fmt.Sprintf("%s-%d-3", name, att)), last
			fmt.Printf("\n>>> %s, the only free node, is cordoned; node %s (rank 3's) goes down: no node can take rank 3\n\n", freeNode, lostNode)
			if err := cordon(ctx, c, freeNode, true); err != nil {
				return err
			}
			lost = time.Now()
			if err := a.NodeDown(ctx, lostNode); err != nil {
				return err
			}
		case !lost.IsZero() && shrinkAdvance == 0 && j.Status.CurrentNodes == 3 && train.ParseLog(logOf(att)).Last > train.ParseLog(logOf(att)).Resumed:
			shrinkAdvance = time.Since(lost)
			fmt.Printf("\n>>> training on 3 nodes %.1fs after the node was lost (elastic.shrinkAfter 10s); %s is uncordoned\n\n", shrinkAdvance.Seconds(), freeNode)
			if err := cordon(ctx, c, freeNode, false); err != nil {
				return err
			}
			uncordoned = time.Now()
		case !uncordoned.IsZero() && growRunning == 0 && j.Status.CurrentNodes == 4 && recovered && train.ParseLog(logOf(att)).Last > train.ParseLog(logOf(att)).Resumed:
			growRunning, grewAt = time.Since(uncordoned), train.ParseLog(logOf(att)).Resumed
			fmt.Printf("\n>>> back on 4 nodes, training %.1fs after %s was schedulable again (elastic.growAfter 10s, then the checkpoint of step %d)\n\n",
				growRunning.Seconds(), freeNode, grewAt)
		}
		time.Sleep(100 * time.Millisecond)
	}
	j := get()
	fmt.Println()
	if !meta.IsStatusConditionTrue(j.Status.Conditions, trainingv1alpha1.ConditionSucceeded) {
		return fmt.Errorf("the job did not succeed: %+v", j.Status.Conditions)
	}
	replaced := replacedSince(podUIDs(), killedPods)
	fmt.Printf("what happened:\n")
	fmt.Printf("  rank 1's worker was killed at step %d: the kubelet restarted the workers in their pods,\n", killedAt)
	fmt.Printf("    training advanced again %.1fs later (every rank running again: %ds), %d pods replaced\n", killAdvance.Seconds(), inPlaceSecs, inPlaceReplaced)
	fmt.Printf("  node %s hung at step %d: its peers found rank 2 silent and restarted in place, its Lease lapsed,\n", failedNode, failedAt)
	fmt.Printf("    the operator quarantined it (%v) and gave rank 2 a new pod elsewhere: training advanced again %.1fs after the hang\n",
		quarantined(j), freezeAdvance.Seconds())
	fmt.Printf("  restarts: %d (%d in place), pods replaced: %d of %d (status.podsReplaced %d); the ranks run on %s\n",
		j.Status.Restarts, j.Status.InPlaceRestarts, replaced, len(killedPods), j.Status.PodsReplaced, nodesOf(ctx, c, j.Status.Attempt()))
	fmt.Printf("  resumed from the checkpoint of step %d after the hang (checkpoint interval %d)\n", train.ParseLog(logOf(j.Status.Attempt())).Resumed, every)
	fmt.Printf("  node %s was lost at step %d with no node free: the gang shrank to 3 nodes (%.1fs to training again), held %s once\n",
		lostNode, lostAt, shrinkAdvance.Seconds(), freeNode)
	fmt.Printf("    it was schedulable, and grew back to 4 at the checkpoint of step %d (%.1fs after); status.resizes %d\n", grewAt, growRunning.Seconds(), j.Status.Resizes)
	if j.Status.LastRecoverySeconds != nil {
		fmt.Printf("  status.lastRecoverySeconds %d (the fault to every rank running again)\n", *j.Status.LastRecoverySeconds)
	}
	if g := j.Status.Goodput; g != nil {
		ms := func(v int64) string {
			return (time.Duration(v) * time.Millisecond).Round(10 * time.Millisecond).String()
		}
		var lost []string
		for _, l := range g.Lost {
			lost = append(lost, fmt.Sprintf("%s %s (%d)", l.Category, ms(l.DownMilliseconds+l.RecomputeMilliseconds), l.Failures))
		}
		fmt.Printf("  status.goodput: %s of %s trained (%s); startup %s; lost %s: %s\n", ms(g.TrainingMilliseconds), ms(g.WallMilliseconds),
			g.EffectiveTrainingTime, ms(g.StartupMilliseconds), ms(g.LostMilliseconds), strings.Join(lost, ", "))
	}
	fmt.Printf("  the job succeeded at step %d\n\nevents:\n", steps)
	evs, _ := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	for _, e := range evs.Items {
		if e.Source.Component != "zaya-operator" && e.ReportingController != "zaya-operator" {
			continue
		}
		fmt.Printf("  %-8s %-22s %s\n", e.Type, e.Reason, e.Message)
	}
	_ = c.Delete(ctx, job)
	_ = c.Delete(ctx, pvc)
	_ = c.Delete(ctx, pv)
	return nil
}

// cordon makes a node unschedulable (on) or schedulable again.
func cordon(ctx context.Context, c client.Client, node string, on bool) error {
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%v}}`, on)
	return c.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, client.RawPatch(types.MergePatchType, []byte(patch)))
}

// replacedSince counts the pods of before that now have another UID or are gone.
func replacedSince(now, before map[string]string) int {
	n := 0
	for pod, uid := range before {
		if now[pod] != uid {
			n++
		}
	}
	return n
}

func quarantined(j *trainingv1alpha1.ZayaTrainingJob) []string {
	var out []string
	for _, q := range j.Status.QuarantinedNodes {
		out = append(out, q.Name)
	}
	return out
}

func nodesOf(ctx context.Context, c client.Client, attempt int32) []string {
	pods := &corev1.PodList{}
	_ = c.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{trainingv1alpha1.JobNameLabel: name, trainingv1alpha1.AttemptLabel: fmt.Sprint(attempt)})
	var out []string
	for _, p := range pods.Items {
		out = append(out, p.Spec.NodeName)
	}
	return out
}
