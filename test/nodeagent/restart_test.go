package nodeagent

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
