package controllers

import (
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// The reconciler injects into the pods it creates, and says once per creation when a job asks
// for the supervisor but its template names no command.
func TestTheReconcilerInjectsTheSupervisor(t *testing.T) {
	for _, tc := range []struct {
		name    string
		command []string
		wrapped bool
	}{{"command", []string{"torchrun"}, true}, {"no command", nil, false}} {
		t.Run(tc.name, func(t *testing.T) {
			job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).WorkerCommand(tc.command, "train.py").Defaulted().Obj()
			job.Generation = 1
			h := newHarness(t, interceptor.Funcs{}, job)
			h.r.SupervisorImage = "registry.example/zaya-worker:v1"
			h.mustReconcile(t, job)
			pods := h.pods(t)
			if len(pods) != 2 {
				t.Fatalf("%d pods, want 2", len(pods))
			}
			for name, p := range pods {
				got := len(p.Spec.InitContainers) == 1
				if got != tc.wrapped {
					t.Errorf("pod %s: supervisor injected %v, want %v", name, got, tc.wrapped)
				}
			}
			warned := slices.ContainsFunc(h.drainEvents(), func(e string) bool {
				return strings.Contains(e, trainingv1alpha1.ReasonSupervisorNotInjected) && strings.Contains(e, "sets no command")
			})
			if warned == tc.wrapped {
				t.Errorf("SupervisorNotInjected warning %v, want %v", warned, !tc.wrapped)
			}
		})
	}
}
