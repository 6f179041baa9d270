package workerpod

import (
	"fmt"
	"math"
	"time"

	corev1 "k8s.io/api/core/v1"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// heartbeatProbe fails when the worker has touched ZAYA_HEARTBEAT_FILE and then not for
// timeout. A trainer that never touches it (a PyTorch script knows nothing of it) is not judged
// by it: a probe that failed it after timeout would kill every such run. Before failing it
// appends a "zaya: hang" line to the termination log so the operator can tell a hang from a
// crash. Templates that bring their own liveness probe (or images without a shell) keep theirs.
func heartbeatProbe(timeout time.Duration) *corev1.Probe {
	// The schema bounds hangTimeout to 24h; a stored older value must not wrap the int32.
	secs := int32(min(timeout.Seconds(), math.MaxInt32))
	period := min(max(secs/6, 10), 60)
	return &corev1.Probe{
		ProbeHandler:        corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", heartbeatScript(secs)}}},
		InitialDelaySeconds: secs,
		PeriodSeconds:       period,
		TimeoutSeconds:      10,
		FailureThreshold:    1,
	}
}

// heartbeatScript checks the heartbeat file's age, if there is one, and, when it is too old,
// appends the hang line to the container's termination log and fails. The file is in the pod's
// /dev/shm, which outlives an in-place restart: a run that hangs before touching it is judged
// by the run before's last touch. Paths come from the container's environment, quoted, never
// pasted into the script: a template's terminationMessagePath may hold anything a shell would run.
func heartbeatScript(secs int32) string {
	return fmt.Sprintf(`f="$%s"; [ ! -e "$f" ] || [ $(( $(date +%%s) - $(stat -c %%Y "$f") )) -lt %d ] || `+
		`{ echo "%s no heartbeat for %ds" >> "$%s"; exit 1; }`,
		trainingv1alpha1.EnvHeartbeatFile, secs, trainingv1alpha1.TerminationMessageHangPrefix, secs, trainingv1alpha1.EnvTerminationLog)
}
