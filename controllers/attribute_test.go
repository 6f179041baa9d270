package controllers

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/attribution"
)

// exitedSaying is a worker that exited with code and termination message msg.
func exitedSaying(node string, code int32, at time.Time, reason, msg string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		exited(node, code, at)(p)
		t := p.Status.ContainerStatuses[0].State.Terminated
		t.Message = msg
		if reason != "" {
			t.Reason = reason
		}
	}
}

func TestAFailuresCategoryComesFromItsEvidence(t *testing.T) {
	gpuFault := "step 120\nMemory access fault by GPU node-2 (Agent handle: 0x55f4c3a1e2b0) on address 0x7f2b3c000000. Reason: Page not present or supervisor privilege.\n"
	for _, c := range []struct {
		name                   string
		fault                  func(h *harness)
		category, rule, inLine string
	}{
		{"a GPU fault the runtime printed", func(h *harness) {
			h.setPod(t, "llm-0-1", exitedSaying("n1", 134, now, "", gpuFault))
		}, "GPUHardware", "hsa-memory-access-fault", "Memory access fault by GPU node-2"},
		{"a traceback in the log's tail", func(h *harness) {
			h.setPod(t, "llm-0-1", exitedSaying("n1", 1, now, "", "Traceback (most recent call last):\n  File \"/app/train.py\", line 3, in <module>\nModuleNotFoundError: No module named 'flash_attn'"))
		}, "UserCode", "python-error", "ModuleNotFoundError"},
		{"the kernel's OOM kill", func(h *harness) {
			h.setPod(t, "llm-0-1", exitedSaying("n1", 137, now, "OOMKilled", ""))
		}, "OutOfMemory", "", "OOMKilled"},
		{"a lost node", func(h *harness) {
			h.setNode(t, "node-llm-0-1", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionUnknown })
		}, "NodeLost", "", ""},
		{"an unhealthy NIC", func(h *harness) {
			h.setNode(t, "node-llm-0-1", func(n *corev1.Node) { n.Status.Allocatable["amd.com/nic"] = resource.MustParse("7") })
		}, "NICFabric", "", ""},
		{"nothing to go by", func(h *harness) {
			h.setPod(t, "llm-0-1", exitedSaying("n1", 1, now, "", "checkpoint-step=40\n"))
		}, "Unknown", "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, job := inPlaceGang(t, func(j *trainingv1alpha1.ZayaTrainingJob) {
				j.Spec.FaultTolerance.RestartMode = trainingv1alpha1.RestartModeRecreate
			})
			c.fault(h)
			h.mustReconcile(t, job)
			f := h.get(t, job).Status.LastFailure
			if f == nil || f.Category != c.category || f.Rule != c.rule || !strings.Contains(f.Evidence, c.inLine) {
				t.Fatalf("lastFailure %+v: want category %s, rule %q, evidence with %q", f, c.category, c.rule, c.inLine)
			}
			if c.rule != "" {
				if ev := h.drainEvents(); !containsSubstring(ev, "["+c.category+", rule "+c.rule+"]") {
					t.Errorf("events %q do not name the category and rule", ev)
				}
			}
		})
	}
}

func TestAnInPlaceRestartIsAttributedFromTheEndedRun(t *testing.T) {
	h, job := inPlaceGang(t)
	fault := now.Add(-3 * time.Second)
	h.setPod(t, "llm-0-1", func(p *corev1.Pod) {
		restartedInPlace("n1", 1, 1, fault, fault.Add(time.Second))(p)
		p.Status.ContainerStatuses[0].LastTerminationState.Terminated.Message =
			"torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 191.98 GiB\n"
	})
	h.mustReconcile(t, job)
	if f := h.get(t, job).Status.LastFailure; f == nil || f.Category != "OutOfMemory" || f.Rule != "torch-gpu-oom" {
		t.Errorf("lastFailure %+v, want OutOfMemory by torch-gpu-oom", f)
	}
}

func TestAUsersPatternsNameTheirOwnFailures(t *testing.T) {
	h, job := inPlaceGang(t, func(j *trainingv1alpha1.ZayaTrainingJob) {
		j.Spec.FaultTolerance.RestartMode = trainingv1alpha1.RestartModeRecreate
	})
	user, err := attribution.Parse([]byte(`[{name: flaky-dataset-mount, category: Storage, regexp: 'dataset shard \d+ unreadable'}]`))
	if err != nil {
		t.Fatal(err)
	}
	h.r.SetFailurePatterns(user)
	h.setPod(t, "llm-0-2", exitedSaying("n2", 1, now, "", "loader: dataset shard 17 unreadable, giving up"))
	h.mustReconcile(t, job)
	if f := h.get(t, job).Status.LastFailure; f == nil || f.Category != "Storage" || f.Rule != "flaky-dataset-mount" {
		t.Errorf("lastFailure %+v, want Storage by the user's rule", f)
	}
}

func containsSubstring(list []string, s string) bool {
	for _, x := range list {
		if strings.Contains(x, s) {
			return true
		}
	}
	return false
}
