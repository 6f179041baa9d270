package controllers

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// flakyStatus makes the job's status writes fail with err while failing is set.
func flakyStatus(failing *atomic.Bool, err error) interceptor.Funcs {
	return interceptor.Funcs{
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			if _, job := obj.(*trainingv1alpha1.ZayaTrainingJob); job && failing.Load() {
				return err
			}
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
	}
}

// scraped is what the operator's registry reports for the metric name with labels (label,
// value, ...): a counter's value, a histogram's count of samples; 0 when none was recorded.
func scraped(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount())
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// countEvents counts the events whose text starts with prefix.
func countEvents(events []string, prefix string) int {
	n := 0
	for _, e := range events {
		if strings.HasPrefix(e, prefix) {
			n++
		}
	}
	return n
}

func TestDecisionsAreCountedOnceTheirStatusIsStored(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"conflict", apierrors.NewConflict(schema.GroupResource{Group: "training.zaya.dev", Resource: "zayatrainingjobs"}, "llm", errors.New("stale"))},
		{"server error", apierrors.NewServiceUnavailable("etcd is sad")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var failing atomic.Bool
			job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Defaulted().Obj()
			h := newHarness(t, flakyStatus(&failing, tc.err), job)
			h.mustReconcile(t, job)
			h.runAll(t)
			h.mustReconcile(t, job)
			h.setPod(t, "llm-0-1", exited("n1", 1, now))
			h.drainEvents()

			restarts := func() float64 {
				return scraped(t, "zaya_gang_restarts_total", "reason", trainingv1alpha1.FailureReasonExitCode,
					"mode", string(trainingv1alpha1.RestartModeRecreate), "mechanism", string(trainingv1alpha1.RestartMechanismRecreate))
			}
			before := restarts()
			// The restart is decided three times over, but stored only by the last pass.
			failing.Store(true)
			for range 2 {
				_, _ = h.reconcile(t, job)
			}
			if got := restarts() - before; got != 0 {
				t.Errorf("restarts counted %v times before any status recorded one", got)
			}
			failing.Store(false)
			h.mustReconcile(t, job)
			h.mustReconcile(t, job) // and a later pass sees it stored: nothing to count
			if got := restarts() - before; got != 1 {
				t.Errorf("one stored restart counted %v times", got)
			}
			if n := countEvents(h.drainEvents(), "Warning Restarting"); n != 1 {
				t.Errorf("%d Restarting events for one stored restart", n)
			}

			// The new attempt comes up; its recovery is decided twice and stored once.
			h.r.Clock = clockAt(now.Add(2 * time.Second))
			h.mustReconcile(t, job)
			h.runAll(t)
			recoveries := scraped(t, "zaya_gang_recovery_seconds", "mode", string(trainingv1alpha1.RestartModeRecreate))
			failing.Store(true)
			_, _ = h.reconcile(t, job)
			if got := scraped(t, "zaya_gang_recovery_seconds", "mode", string(trainingv1alpha1.RestartModeRecreate)) - recoveries; got != 0 {
				t.Errorf("recovery observed %v times before its status was stored", got)
			}
			failing.Store(false)
			h.mustReconcile(t, job)
			h.mustReconcile(t, job)
			if got := scraped(t, "zaya_gang_recovery_seconds", "mode", string(trainingv1alpha1.RestartModeRecreate)) - recoveries; got != 1 {
				t.Errorf("one stored recovery observed %v times", got)
			}
			if n := countEvents(h.drainEvents(), "Normal Recovered"); n != 1 {
				t.Errorf("%d Recovered events for one stored recovery", n)
			}
		})
	}
}

// shuffledPods lists pods in a new random order on every call, as an informer's cache may.
func shuffledPods(seed uint64) interceptor.Funcs {
	rng := rand.New(rand.NewPCG(seed, seed))
	return interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if err := c.List(ctx, list, opts...); err != nil {
				return err
			}
			if pods, ok := list.(*corev1.PodList); ok {
				rng.Shuffle(len(pods.Items), func(i, j int) { pods.Items[i], pods.Items[j] = pods.Items[j], pods.Items[i] })
			}
			return nil
		},
	}
}

func TestAWaitingGangWritesNothingUntilSomethingChanges(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(16).Generation(1).Defaulted().Obj()
	h := newHarness(t, shuffledPods(1), job)
	h.mustReconcile(t, job)
	// Ranks 0-3 are placed; every other rank is unschedulable, each with its own message.
	for r := range 16 {
		name := fmt.Sprintf("llm-0-%d", r)
		if r < 4 {
			h.setPod(t, name, running(fmt.Sprintf("n%d", r)))
			continue
		}
		h.setPod(t, name, unschedulable(fmt.Sprintf("0/4 nodes are available for rank %d", r)))
	}
	h.r.Clock = clockAt(now.Add(capacityGrace))
	h.mustReconcile(t, job)
	got := h.get(t, job)
	c := condition(got, trainingv1alpha1.ConditionWaitingForCapacity)
	if c == nil || c.Message != "4/16 ranks placed, 12 unschedulable: rank 4: 0/4 nodes are available for rank 4" {
		t.Fatalf("WaitingForCapacity = %+v, want the lowest unschedulable rank named", c)
	}
	h.expectQuiet(t, job, 50)

	// Something changes: one more rank is placed; that is written once.
	h.setPod(t, "llm-0-4", running("n4"))
	h.writes.Store(0)
	for range 10 {
		h.mustReconcile(t, job)
	}
	if w := h.writes.Load(); w != 1 {
		t.Errorf("one placement made %d writes, want 1", w)
	}
	if c := condition(h.get(t, job), trainingv1alpha1.ConditionWaitingForCapacity); !strings.HasPrefix(c.Message, "5/16 ranks placed, 11 unschedulable: rank 5:") {
		t.Errorf("after placing rank 4: %q", c.Message)
	}
}

func TestTheFirstFailureDoesNotDependOnTheListingOrder(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(8).Generation(1).Defaulted().Obj()
	var pods []corev1.Pod
	for r := range int32(8) {
		pod := newWorkerPod(job, nil, r)
		exited(fmt.Sprintf("n%d", r), 1, now)(pod) // every rank failed in the same second
		pods = append(pods, *pod)
	}
	rng := rand.New(rand.NewPCG(2, 2))
	for range 20 {
		rng.Shuffle(len(pods), func(i, j int) { pods[i], pods[j] = pods[j], pods[i] })
		if r, _ := gang.Rank(gang.Of(job, pods).FirstFailure()); r != 0 {
			t.Fatalf("first failure is rank %d for one listing order, want rank 0 for every order", r)
		}
	}
}
