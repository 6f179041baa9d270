package workerpod

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// TestHeartbeatScriptRunsInAShell runs the probe's script with sh, as the kubelet would.
func TestHeartbeatScriptRunsInAShell(t *testing.T) {
	dir := t.TempDir()
	beat, termLog := filepath.Join(dir, "heartbeat"), filepath.Join(dir, "termination-log")
	run := func() error {
		cmd := exec.Command("sh", "-c", heartbeatScript(60))
		cmd.Env = append(os.Environ(), "ZAYA_HEARTBEAT_FILE="+beat, "ZAYA_TERMINATION_LOG="+termLog)
		return cmd.Run()
	}
	if err := run(); err != nil {
		t.Errorf("a worker that never touched its heartbeat failed the probe: %v", err)
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
	// The operator tells a hang from a crash by a termination message line with this prefix.
	if !strings.HasPrefix(string(msg), trainingv1alpha1.TerminationMessageHangPrefix+" ") {
		t.Errorf("termination message %q is not a hang line", msg)
	}
}

// TestTerminationLogFollowsTheContainer: a template with its own terminationMessagePath gets
// it in ZAYA_TERMINATION_LOG and in the heartbeat probe's hang line.
func TestTerminationLogFollowsTheContainer(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "team").Nodes(1).Defaulted().Obj()
	job.Spec.Template.Spec.Containers[0].TerminationMessagePath = "/var/run/zaya/message"
	pod := Render(job, nil, 0)
	w := pod.Spec.Containers[0]
	if got := envMap(w.Env)["ZAYA_TERMINATION_LOG"]; got != "/var/run/zaya/message" {
		t.Errorf("ZAYA_TERMINATION_LOG = %q", got)
	}
	if w.LivenessProbe == nil || !strings.Contains(w.LivenessProbe.Exec.Command[2], `>> "$ZAYA_TERMINATION_LOG"`) {
		t.Errorf("probe does not write the container's termination log: %+v", w.LivenessProbe)
	}
}

// TestNoPathFromTheSpecReachesTheProbesShell: a terminationMessagePath full of shell syntax is
// neither pasted into the probe's script nor run when the probe fails; the hang line lands in
// that very file.
func TestNoPathFromTheSpecReachesTheProbesShell(t *testing.T) {
	dir := t.TempDir()
	canary := filepath.Join(dir, "pwned")
	hostile := filepath.Join(dir, "log $(touch pwned); touch pwned `touch pwned` >pwned")
	job := testjob.MakeZayaTrainingJob("llm", "team").Nodes(1).Defaulted().Obj()
	job.Spec.Template.Spec.Containers[0].TerminationMessagePath = hostile
	w := Render(job, nil, 0).Spec.Containers[0]
	script := w.LivenessProbe.Exec.Command[2]
	if strings.Contains(script, "pwned") {
		t.Fatalf("the probe's script contains the template's path: %s", script)
	}
	beat := filepath.Join(dir, "heartbeat") // stale: the probe fails and writes
	old := time.Now().Add(-time.Hour)
	if err := os.WriteFile(beat, nil, 0o600); err != nil || os.Chtimes(beat, old, old) != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", script)
	cmd.Dir = dir // where the injected commands would leave the canary
	cmd.Env = append(os.Environ(), "ZAYA_HEARTBEAT_FILE="+beat, "ZAYA_TERMINATION_LOG="+envMap(w.Env)["ZAYA_TERMINATION_LOG"])
	if err := cmd.Run(); err == nil {
		t.Fatal("a stale heartbeat passed the probe")
	}
	if _, err := os.Stat(canary); err == nil {
		t.Fatal("the shell ran a command from the template's terminationMessagePath")
	}
	if msg, err := os.ReadFile(hostile); err != nil || !strings.Contains(string(msg), "zaya: hang") {
		t.Errorf("the hang line did not land in the container's termination log: %q, %v", msg, err)
	}
}
