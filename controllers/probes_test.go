package controllers

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// TestHeartbeatScriptRunsInAShell runs the probe's script with sh, as the kubelet would.
func TestHeartbeatScriptRunsInAShell(t *testing.T) {
	dir := t.TempDir()
	beat, termLog := filepath.Join(dir, "heartbeat"), filepath.Join(dir, "termination-log")
	run := func() error {
		cmd := exec.Command("sh", "-c", heartbeatScript(60, termLog))
		cmd.Env = append(os.Environ(), "ZAYA_HEARTBEAT_FILE="+beat)
		return cmd.Run()
	}
	if err := run(); err == nil {
		t.Error("no heartbeat yet (past the initial delay) must fail")
	}
	if err := os.WriteFile(beat, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := run(); err != nil {
		t.Errorf("a fresh heartbeat failed the probe: %v", err)
	}
	old := time.Now().Add(-2 * time.Minute)
	if err := os.Chtimes(beat, old, old); err != nil {
		t.Fatal(err)
	}
	if err := run(); err == nil {
		t.Error("a heartbeat 2 minutes old passed a 60 s probe")
	}
	msg, err := os.ReadFile(termLog)
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "worker"}}}}
	exited("n", 137, now)(pod)
	pod.Status.ContainerStatuses[0].State.Terminated.Message = "checkpoint-step=7\n" + string(msg)
	if !hung(pod) {
		t.Errorf("termination message %q is not recognised as a hang", msg)
	}
}

// TestTerminationLogFollowsTheContainer: a template with its own terminationMessagePath gets
// it in ZAYA_TERMINATION_LOG and in the heartbeat probe's hang line.
func TestTerminationLogFollowsTheContainer(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "team").Nodes(1).Defaulted().Obj()
	job.Spec.Template.Spec.Containers[0].TerminationMessagePath = "/var/run/zaya/message"
	pod := newWorkerPod(job, nil, 0)
	w := pod.Spec.Containers[0]
	if got := envMap(w.Env)["ZAYA_TERMINATION_LOG"]; got != "/var/run/zaya/message" {
		t.Errorf("ZAYA_TERMINATION_LOG = %q", got)
	}
	if w.LivenessProbe == nil || !strings.Contains(w.LivenessProbe.Exec.Command[2], ">> /var/run/zaya/message") {
		t.Errorf("probe does not write the container's termination log: %+v", w.LivenessProbe)
	}
}
