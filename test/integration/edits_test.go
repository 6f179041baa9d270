package integration

import (
	"context"
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// runningEdits change fields that may change while a job runs, to extreme or hostile values.
var runningEdits = []struct{ name, patch string }{
	{"checkpoint.mountPath over /dev/shm", `{spec: {checkpoint: {mountPath: /dev/shm}}}`},
	{"checkpoint.mountPath through ..", `{spec: {checkpoint: {mountPath: /checkpoints/../dev/shm}}}`},
	{"checkpoint.mountPath root", `{spec: {checkpoint: {mountPath: /}}}`},
	{"checkpoint.mountPath with shell syntax", `{spec: {checkpoint: {mountPath: "/ck;touch /tmp/owned"}}}`},
	{"checkpoint.mountPath over a template mount", `{spec: {checkpoint: {mountPath: /data}}}`},
	{"checkpoint.interval steps at int32 max", `{spec: {checkpoint: {interval: {steps: 2147483647, duration: null}}}}`},
	{"checkpoint.interval duration at its largest", `{spec: {checkpoint: {interval: {duration: 2562047h}}}}`},
	{"checkpoint.keep at its largest", `{spec: {checkpoint: {keep: 100}}}`},
	{"hangTimeout at time.Duration's largest", `{spec: {faultTolerance: {hangTimeout: 2562047h}}}`},
	{"hangTimeout of 24h", `{spec: {faultTolerance: {hangTimeout: 24h}}}`},
	{"terminatingTimeout of 1h", `{spec: {faultTolerance: {terminatingTimeout: 1h}}}`},
	{"restartWindow at its largest", `{spec: {faultTolerance: {restartWindow: 2562047h}}}`},
	{"backoff of an hour", `{spec: {faultTolerance: {backoff: {initial: 1h, max: 1h}}}}`},
	{"quarantine expireAfter at its largest", `{spec: {faultTolerance: {quarantine: {expireAfter: 2562047h, maxNodes: 1}}}}`},
	{"maxRestarts at its largest", `{spec: {faultTolerance: {maxRestarts: 1000}}}`},
	{"activeDeadlineSeconds at int64 max", `{spec: {activeDeadlineSeconds: 9223372036854775807}}`},
	{"ttlSecondsAfterFinished at int32 max", `{spec: {ttlSecondsAfterFinished: 2147483647}}`},
	{"successPolicy AllRanks", `{spec: {successPolicy: AllRanks}}`},
	{"job labels and annotations", `{metadata: {labels: {a: "", b.example.com/c: x}, annotations: {d: "$(MASTER_ADDR); reboot"}}}`},
}

// TestRunningEditsAreRefusedOrTakeEffect: an edit of a running job is refused at the API
// server, or the operator accepts it and the job goes on: no InvalidSpec, no rank lost, and
// the next gang restart builds pods the API server takes.
func TestRunningEditsAreRefusedOrTakeEffect(t *testing.T) {
	startManager(t)
	for i, e := range runningEdits {
		t.Run(e.name, func(t *testing.T) {
			g := NewWithT(t)
			ctx := context.Background()
			ns := newNamespace(t)
			name := fmt.Sprintf("edit%d", i)
			job := testjob.MakeZayaTrainingJob(name, ns).Nodes(2).NewCheckpoint("1Gi", "").Obj()
			pod := &job.Spec.Template.Spec
			pod.Volumes = append(pod.Volumes, corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
			pod.Containers[0].VolumeMounts = append(pod.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "data", MountPath: "/data"})
			g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
			for _, p := range waitPods(g, ns, name, 2) {
				setPodStatus(g, p, runningReady)
			}

			patch, err := yaml.YAMLToJSON([]byte(e.patch))
			g.Expect(err).NotTo(HaveOccurred())
			if err := k8sClient.Patch(ctx, job, rawMergePatch(patch)); err != nil {
				t.Logf("refused: %v", err)
				return
			}
			g.Eventually(func(g Gomega) {
				got := getJob(g, job)
				g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
				created := meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionCreated)
				g.Expect(created).NotTo(BeNil())
				g.Expect(created.Status).To(Equal(metav1.ConditionTrue), "accepted, then found invalid: %s", created.Message)
			}, timeout, interval).Should(Succeed())
			g.Expect(jobPods(g, ns, name)).To(HaveKey(name+"-0-1"), "a rank was lost")

			// The next restart builds pods from the edited spec.
			setPodStatus(g, jobPods(g, ns, name)[name+"-0-1"], failedWith(2))
			g.Eventually(func(g Gomega) {
				got := getJob(g, job)
				g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionFailed)).To(BeFalse(),
					"failed: %v", got.Status.Conditions)
				if got.Status.Restarts == 1 && meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionRestarting) &&
					got.Spec.FaultTolerance.Backoff.Initial.Duration > timeout {
					return // waiting out the backoff it was given
				}
				g.Expect(jobPods(g, ns, name)).To(SatisfyAll(HaveKey(name+"-1-0"), HaveKey(name+"-1-1")))
			}, timeout, interval).Should(Succeed())
		})
	}
}
