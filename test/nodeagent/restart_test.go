package nodeagent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

func TestShouldRestartFollowsKubernetes(t *testing.T) {
	never, always, onFailure := corev1.ContainerRestartPolicyNever, corev1.ContainerRestartPolicyAlways, corev1.ContainerRestartPolicyOnFailure
	rule := func(op corev1.ContainerRestartRuleOnExitCodesOperator, codes ...int32) corev1.ContainerRestartRule {
		return corev1.ContainerRestartRule{Action: corev1.ContainerRestartRuleActionRestart,
			ExitCodes: &corev1.ContainerRestartRuleOnExitCodes{Operator: op, Values: codes}}
	}
	for _, tc := range []struct {
		name      string
		pod       corev1.RestartPolicy
		container *corev1.ContainerRestartPolicy
		rules     []corev1.ContainerRestartRule
		code      int
		want      bool
	}{
		{"pod Never", corev1.RestartPolicyNever, nil, nil, 1, false},
		{"pod OnFailure, failed", corev1.RestartPolicyOnFailure, nil, nil, 1, true},
		{"pod OnFailure, succeeded", corev1.RestartPolicyOnFailure, nil, nil, 0, false},
		{"pod Always, succeeded", corev1.RestartPolicyAlways, nil, nil, 0, true},
		{"container policy over the pod's", corev1.RestartPolicyAlways, &never, nil, 1, false},
		{"container OnFailure", corev1.RestartPolicyNever, &onFailure, nil, 2, true},
		{"rule In matches", corev1.RestartPolicyNever, &never, []corev1.ContainerRestartRule{rule(corev1.ContainerRestartRuleOnExitCodesOpIn, 75)}, 75, true},
		{"rule In misses, policy decides", corev1.RestartPolicyNever, &never, []corev1.ContainerRestartRule{rule(corev1.ContainerRestartRuleOnExitCodesOpIn, 75)}, 1, false},
		{"rule NotIn", corev1.RestartPolicyNever, &never, []corev1.ContainerRestartRule{rule(corev1.ContainerRestartRuleOnExitCodesOpNotIn, 0, 78)}, 137, true},
		{"rule NotIn, excluded code", corev1.RestartPolicyNever, &always, []corev1.ContainerRestartRule{rule(corev1.ContainerRestartRuleOnExitCodesOpNotIn, 0, 78)}, 78, true},
		{"a rule without exit codes never matches", corev1.RestartPolicyNever, &never, []corev1.ContainerRestartRule{{Action: corev1.ContainerRestartRuleActionRestart}}, 1, false},
	} {
		pod := &corev1.Pod{Spec: corev1.PodSpec{RestartPolicy: tc.pod}}
		c := &corev1.Container{RestartPolicy: tc.container, RestartPolicyRules: tc.rules}
		if got := shouldRestart(pod, c, tc.code); got != tc.want {
			t.Errorf("%s: restart on exit %d = %v, want %v", tc.name, tc.code, got, tc.want)
		}
	}
}

func TestRestartDelayIsTheKubeletsBackOff(t *testing.T) {
	for n, want := range map[int32]time.Duration{1: 0, 2: 10 * time.Second, 3: 20 * time.Second, 4: 40 * time.Second, 20: 300 * time.Second} {
		if got := restartDelay(n, 0); got != want {
			t.Errorf("restart %d: %v, want %v", n, got, want)
		}
	}
	if got := restartDelay(5, time.Second); got != time.Second {
		t.Errorf("capped at 1 s: %v", got)
	}
}

// A container whose restart rule matches its exit code runs again in the same pod: the pod
// stays Running at the same address, restartCount and lastState carry the exit code and the
// first process's termination message, and the second process's exit ends the pod.
func TestAContainerRestartsInPlaceByItsRules(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := fake.NewClientset()
	_, err := Start(ctx, Options{Client: cs, Nodes: []string{"n0"}, WorkDir: t.TempDir(),
		Commands: map[string]string{"sh": "/bin/sh"}, MaxContainerRestartPeriod: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// First run: leaves a mark, says why in its termination log and exits 75; second: exits 3.
	script := `if [ -e ran ]; then exit 3; fi; touch ran; echo "zaya: stopped: peer rank 1" > "$TERM_LOG"; exit 75`
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "w", Namespace: "ns", UID: "u1"},
		Spec: corev1.PodSpec{NodeName: "n0", RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
			Name: "worker", Command: []string{"sh", "-c", script}, Env: []corev1.EnvVar{{Name: "TERM_LOG", Value: "/dev/termination-log"}},
			RestartPolicy: ptr.To(corev1.ContainerRestartPolicyNever),
			RestartPolicyRules: []corev1.ContainerRestartRule{{Action: corev1.ContainerRestartRuleActionRestart,
				ExitCodes: &corev1.ContainerRestartRuleOnExitCodes{Operator: corev1.ContainerRestartRuleOnExitCodesOpIn, Values: []int32{75}}}},
		}}}}
	if _, err := cs.CoreV1().Pods("ns").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *corev1.Pod
	_ = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err = cs.CoreV1().Pods("ns").Get(ctx, "w", metav1.GetOptions{})
		return err != nil || got.Status.Phase == corev1.PodFailed, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != corev1.PodFailed || len(got.Status.ContainerStatuses) != 1 {
		t.Fatalf("pod status %+v, want Failed after the second run", got.Status)
	}
	cs0 := got.Status.ContainerStatuses[0]
	if cs0.RestartCount != 1 {
		t.Errorf("restartCount %d, want 1", cs0.RestartCount)
	}
	if term := cs0.State.Terminated; term == nil || term.ExitCode != 3 {
		t.Errorf("state %+v, want terminated with the second run's exit 3", cs0.State)
	}
	last := cs0.LastTerminationState.Terminated
	if last == nil || last.ExitCode != 75 || !strings.Contains(last.Message, "zaya: stopped: peer rank 1") {
		t.Errorf("lastState %+v, want the first run's exit 75 and its message", cs0.LastTerminationState)
	}
	if term := cs0.State.Terminated; term != nil && strings.Contains(term.Message, "zaya: stopped") {
		t.Errorf("the second run's message %q repeats the first's: each run starts an empty termination log", term.Message)
	}
}

// A frozen node's kubelet is gone and its processes are stopped: no status or Lease renewal,
// and a pod deleted from the API keeps its (stopped) process, as on a hung host, until the
// agent itself stops.
func TestAFrozenNodeRenewsNothingAndLeavesItsProcessesStopped(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := fake.NewClientset()
	a, err := Start(ctx, Options{Client: cs, Nodes: []string{"n0"}, WorkDir: t.TempDir(), Commands: map[string]string{"sh": "/bin/sh"}})
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "w", Namespace: "ns", UID: "u1"},
		Spec: corev1.PodSpec{NodeName: "n0", RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "worker", Command: []string{"sh", "-c", "sleep 600"}}}}}
	if _, err := cs.CoreV1().Pods("ns").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		if r := a.runs["ns/w"]; r != nil && r.cmd != nil && r.cmd.Process != nil {
			pid = r.cmd.Process.Pid
		}
		return pid != 0, nil
	}); err != nil {
		t.Fatal("the pod's process never started")
	}
	if err := a.postStatus(ctx, "n0"); err != nil {
		t.Fatal(err)
	}
	lease, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, "n0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	if err := a.Freeze("n0"); err != nil {
		t.Fatal(err)
	}
	// SIGSTOP takes effect when the process next runs: a sleeping one wakes (R) to stop.
	if err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return processState(t, pid) == "T", nil
	}); err != nil {
		t.Errorf("process state %q 5 s after Freeze, want T (stopped)", processState(t, pid))
	}
	if err := a.postStatus(ctx, "n0"); err != nil {
		t.Fatal(err)
	}
	after, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, "n0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !after.Spec.RenewTime.Equal(lease.Spec.RenewTime) {
		t.Errorf("a frozen node's Lease was renewed: %v, then %v", lease.Spec.RenewTime, after.Spec.RenewTime)
	}
	if err := cs.CoreV1().Pods("ns").Delete(ctx, "w", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Once its cache has lost the pod, the agent's sync for it is what a kubelet would do.
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		_, err := a.pods.Pods("ns").Get("w")
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Fatal("the agent never saw the pod deleted")
	}
	if _, err := a.sync(ctx, "ns/w"); err != nil {
		t.Fatal(err)
	}
	if got := processState(t, pid); got != "T" {
		t.Errorf("process state %q after its pod was deleted, want T: a dead kubelet kills nothing", got)
	}
	cancel()
	if err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return processState(t, pid) == "", nil
	}); err != nil {
		t.Error("the frozen process outlived the agent")
	}
}

// processState is the state letter of /proc/pid/stat ("" once the process is gone or reaped).
func processState(t *testing.T, pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// pid (comm) state ...: comm may hold spaces, so read after the last ')'.
	s := string(b)
	rest := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(rest) == 0 {
		t.Fatalf("unreadable stat %q", s)
	}
	if rest[0] == "Z" {
		return ""
	}
	return rest[0]
}

// Init containers run first, in order, each to its end, as a kubelet runs them: a file the
// first writes into an emptyDir is the next container's program (run as the file it is, as
// zaya-supervisor's install hands the binary on), and each one's end is reported in
// initContainerStatuses. A failing one under restartPolicy Never fails the pod before its
// container starts.
func TestInitContainersRunFirstAndHandTheirFilesOn(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := fake.NewClientset()
	dir := t.TempDir()
	a, err := Start(ctx, Options{Client: cs, Nodes: []string{"n0"}, WorkDir: dir, Commands: map[string]string{"sh": "/bin/sh"}})
	if err != nil {
		t.Fatal(err)
	}
	tools := corev1.VolumeMount{Name: "tools", MountPath: "/tools"}
	out := corev1.VolumeMount{Name: "out", MountPath: "/out"}
	volumes := []corev1.Volume{{Name: "tools", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "out", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	install := `printf '#!/bin/sh\necho "ran $*" > /out/said\n' > /tools/run && chmod 555 /tools/run`
	for _, tc := range []struct {
		name      string
		second    string // the second init container's script
		phase     corev1.PodPhase
		initCodes []int32
		said      string
	}{
		{"both succeed", "echo second >> /out/order", corev1.PodSucceeded, []int32{0, 0}, "ran x\n"},
		{"the second fails", "exit 3", corev1.PodFailed, []int32{0, 3}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := strings.ReplaceAll(tc.name, " ", "-")
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: "u-" + types.UID(name)},
				Spec: corev1.PodSpec{NodeName: "n0", RestartPolicy: corev1.RestartPolicyNever, Volumes: volumes,
					InitContainers: []corev1.Container{
						{Name: "install", Command: []string{"/bin/sh", "-c", install}, VolumeMounts: []corev1.VolumeMount{tools, out}},
						{Name: "second", Command: []string{"sh", "-c", tc.second}, VolumeMounts: []corev1.VolumeMount{out}},
					},
					Containers: []corev1.Container{{Name: "worker", Command: []string{"/tools/run", "x"}, VolumeMounts: []corev1.VolumeMount{tools, out}}}}}
			if _, err := cs.CoreV1().Pods("ns").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			var got *corev1.Pod
			_ = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
				got, err = cs.CoreV1().Pods("ns").Get(ctx, pod.Name, metav1.GetOptions{})
				return err != nil || got.Status.Phase == corev1.PodSucceeded || got.Status.Phase == corev1.PodFailed, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if got.Status.Phase != tc.phase {
				t.Fatalf("phase %s, want %s: %+v", got.Status.Phase, tc.phase, got.Status)
			}
			var codes []int32
			for _, s := range got.Status.InitContainerStatuses {
				if s.State.Terminated == nil {
					t.Fatalf("init container %s not terminated: %+v", s.Name, s.State)
				}
				codes = append(codes, s.State.Terminated.ExitCode)
			}
			if fmt.Sprint(codes) != fmt.Sprint(tc.initCodes) {
				t.Errorf("init containers' exits %v, want %v", codes, tc.initCodes)
			}
			said, _ := os.ReadFile(filepath.Join(a.PodDir("ns", pod.Name), "volumes", "out", "said"))
			if string(said) != tc.said {
				t.Errorf("the container said %q, want %q", said, tc.said)
			}
		})
	}
}

// A kubelet runs only the pods bound to its node. The agent's queue is keyed by name, so the
// deletion of a replaced rank's pod can bring the sync of its new pod of the same name before
// the scheduler placed it; started then, it ran with no node (the chaos soak's seed 3979071851:
// `started on  at …`, and the test could not find the rank's node for its next fault).
func TestAPodNotBoundToTheAgentsNodesIsNotStarted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := fake.NewClientset()
	a, err := Start(ctx, Options{Client: cs, Nodes: []string{"n0"}, WorkDir: t.TempDir(), Commands: map[string]string{"sh": "/bin/sh"}})
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "w", Namespace: "ns", UID: "u2"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Command: []string{"sh", "-c", "sleep 30"}}}}}
	if _, err := cs.CoreV1().Pods("ns").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		_, err := a.pods.Pods("ns").Get("w")
		return err == nil, nil
	}); err != nil {
		t.Fatal("the agent's cache never showed the pod")
	}
	if _, err := a.sync(ctx, "ns/w"); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	r := a.runs["ns/w"]
	a.mu.Unlock()
	if r != nil {
		a.stop(r, 0)
		t.Fatalf("the agent started a pod bound to no node (run on %q)", r.node)
	}
	got, err := cs.CoreV1().Pods("ns").Get(ctx, "w", metav1.GetOptions{})
	if err != nil || len(got.Status.ContainerStatuses) > 0 || got.Status.PodIP != "" {
		t.Errorf("pod status %+v (%v), want it untouched until it is bound", got.Status, err)
	}
}

// A pod replaced by one of its name on another node while its node was frozen keeps its
// stopped process (a hung kubelet knows nothing of the new pod); when the node comes back its
// process runs on until the kubelet learns the pod is gone, then is stopped (SIGTERM first:
// the script's trap writes that it heard it), and the new pod's process is untouched.
func TestAThawedNodeStopsThePodReplacedWhileItWasFrozen(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := fake.NewClientset()
	dir := t.TempDir()
	a, err := Start(ctx, Options{Client: cs, Nodes: []string{"n0", "n1"}, WorkDir: dir, Commands: map[string]string{"sh": "/bin/sh"}})
	if err != nil {
		t.Fatal(err)
	}
	heard := filepath.Join(dir, "heard")
	script := fmt.Sprintf("trap 'echo TERM > %s; exit 0' TERM; while :; do sleep 0.05; done", heard)
	pod := func(uid types.UID, node string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "w", Namespace: "ns", UID: uid},
			Spec: corev1.PodSpec{NodeName: node, RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: ptr.To[int64](5),
				Containers: []corev1.Container{{Name: "worker", Command: []string{"sh", "-c", script}}}}}
	}
	running := func(node string, uid types.UID) bool { return slices.Contains(a.Processes(node), uid) }
	poll := func(what string, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			return cond(), nil
		}); err != nil {
			t.Fatal(what)
		}
	}
	if _, err := cs.CoreV1().Pods("ns").Create(ctx, pod("old", "n0"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("the old pod's process never started", func() bool { return running("n0", "old") })
	if err := a.Freeze("n0"); err != nil {
		t.Fatal(err)
	}
	// The operator's force delete and the rank's new pod, same name, elsewhere.
	if err := cs.CoreV1().Pods("ns").Delete(ctx, "w", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods("ns").Create(ctx, pod("new", "n1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("the new pod's process never started", func() bool { return running("n1", "new") })
	if !running("n0", "old") {
		t.Fatal("the frozen node's process was stopped by the new pod of its name: a hung kubelet stops nothing")
	}
	if err := a.Thaw("n0"); err != nil {
		t.Fatal(err)
	}
	poll("the replaced pod's process outlived its node's return", func() bool { return !running("n0", "old") })
	if b, err := os.ReadFile(heard); err != nil || strings.TrimSpace(string(b)) != "TERM" {
		t.Errorf("the replaced pod's process was not sent SIGTERM first (%q, %v)", b, err)
	}
	if !running("n1", "new") {
		t.Error("the new pod's process was stopped")
	}
}
