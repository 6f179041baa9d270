package integration

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers"
	"github.com/zaya-operator/zaya-operator/controllers/admission/kueuegate"
	"github.com/zaya-operator/zaya-operator/internal/kueue"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// startManager runs the operator's manager against envtest until the test ends.
func startManager(t *testing.T) {
	t.Helper()
	startStoppableManager(t)
}

// startStoppableManager runs the operator's manager until the returned stop is called or the
// test ends.
func startStoppableManager(t *testing.T) (stop func()) {
	t.Helper()
	return startManagerAs(t, cfg)
}

// startManagerAs runs the manager with the given client config (another identity, a
// recording transport) until the returned stop is called or the test ends.
func startManagerAs(t *testing.T, cfg *rest.Config) (stop func()) {
	t.Helper()
	return startManagerWith(t, cfg, nil)
}

// startManagerWith is startManagerAs whose manager builds its client with newClient (nil:
// the default).
func startManagerWith(t *testing.T, cfg *rest.Config, newClient client.NewClientFunc) (stop func()) {
	t.Helper()
	return startManagerMarking(t, cfg, newClient, podMarkSecret)
}

// podMarkSecret keeps the key the managers of the suite mark pods with, in the operator's
// namespace as installed (the RBAC test's operator may read only that one).
var podMarkSecret = types.NamespacedName{Namespace: "zaya-system", Name: "zaya-operator-pod-mark"}

// failurePatternsConfigMap is where the suite's operators read failure patterns from.
var failurePatternsConfigMap = types.NamespacedName{Namespace: "zaya-system", Name: "zaya-operator-failure-patterns"}

// startManagerMarking is startManagerWith whose operator keeps its pod-mark key in markSecret.
func startManagerMarking(t *testing.T, cfg *rest.Config, newClient client.NewClientFunc, markSecret types.NamespacedName) (stop func()) {
	t.Helper()
	return startManagerConfigured(t, cfg, newClient, markSecret, nil)
}

// startManagerConfigured is startManagerMarking whose reconciler configure changes first.
func startManagerConfigured(t *testing.T, cfg *rest.Config, newClient client.NewClientFunc, markSecret types.NamespacedName,
	configure func(*controllers.ZayaTrainingJobReconciler)) (stop func()) {
	t.Helper()
	cacheOpts := controllers.CacheOptions()
	if probe := (&controllers.ZayaTrainingJobReconciler{}); configure != nil {
		if configure(probe); probe.Admission != nil {
			// As main.go with --kueue-workloads (which needs Kueue's CRDs: not every API
			// server of the suite has them).
			cacheOpts.ByObject[&kueue.Workload{}] = cache.ByObject{Transform: kueue.SlimWorkload}
		}
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		NewClient:              newClient,
		Scheme:                 scheme,
		Cache:                  cacheOpts,
		Client:                 controllers.ClientOptions(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             ctrlConfigSkipNameValidation(),
	})
	if err != nil {
		t.Fatalf("manager: %v", err)
	}
	r := &controllers.ZayaTrainingJobReconciler{
		Client:        mgr.GetClient(),
		APIReader:     mgr.GetAPIReader(),
		Recorder:      mgr.GetEventRecorder("zaya-operator"),
		Clock:         clock.RealClock{},
		PodMarkSecret: markSecret,
		// As main.go: Kueue's pod groups always, its Workloads only where configured.
		Admission: kueuegate.New(mgr.GetClient(), mgr.GetAPIReader(), false),
	}
	if configure != nil {
		configure(r)
	}
	if err := r.SetupWithManager(mgr, 2); err != nil {
		t.Fatalf("setup: %v", err)
	}
	// As installed: the failure patterns of a ConfigMap in the operator's namespace.
	if err := mgr.Add(&controllers.FailurePatterns{Reader: mgr.GetAPIReader(), Key: failurePatternsConfigMap,
		Recorder: mgr.GetEventRecorder("zaya-operator"), Target: r, Interval: time.Second}); err != nil {
		t.Fatalf("failure patterns: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("manager: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func TestOperatorMarksJobsCreated(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	startManager(t)
	ctx := context.Background()

	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(16).Obj()
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())

	g.Eventually(func(g Gomega) {
		got := &trainingv1alpha1.ZayaTrainingJob{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(job), got)).To(Succeed())
		g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
		c := meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionCreated)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
		g.Expect(c.Reason).To(Equal(trainingv1alpha1.ReasonAccepted))
		g.Expect(c.ObservedGeneration).To(Equal(got.Generation))
	}, timeout, interval).Should(Succeed())

	// A spec change is observed too (suspend is always mutable).
	g.Expect(k8sClient.Patch(ctx, job, client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"suspend":true}}`)))).To(Succeed())
	g.Eventually(func(g Gomega) {
		got := &trainingv1alpha1.ZayaTrainingJob{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(job), got)).To(Succeed())
		g.Expect(got.Generation).To(BeNumerically(">", 1))
		g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
	}, timeout, interval).Should(Succeed())
}

func TestOperatorReportsTemplateConflicts(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	startManager(t)
	ctx := context.Background()

	// The CRD cannot afford this rule within its CEL budget, so the operator reports it.
	job := testjob.MakeZayaTrainingJob("llm", ns).WorkerEnv("WORLD_SIZE", "1").Obj()
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	g.Eventually(func(g Gomega) {
		got := &trainingv1alpha1.ZayaTrainingJob{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(job), got)).To(Succeed())
		c := meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionCreated)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(c.Reason).To(Equal(trainingv1alpha1.ReasonInvalidSpec))
		g.Expect(c.Message).To(ContainSubstring("spec.template.spec.containers[0].env[0].name"))
	}, timeout, interval).Should(Succeed())
}

func TestAPIServerDefaultsMatchGoDefaults(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	for _, c := range []struct {
		name string
		job  *trainingv1alpha1.ZayaTrainingJob
	}{
		{"minimal", testjob.MakeZayaTrainingJob("minimal", ns).Obj()},
		{"new checkpoint volume", testjob.MakeZayaTrainingJob("new-volume", ns).NewCheckpoint("10Ti", "ibmc-vpc-file-3000-iops").Obj()},
		{"existing claim, socket network", testjob.MakeZayaTrainingJob("claim", ns).ClaimCheckpoint("ckpt").Profile(trainingv1alpha1.NetworkSocket).Obj()},
	} {
		t.Run(c.name, func(t *testing.T) {
			want := c.job.DeepCopy()
			want.Default()
			if err := k8sClient.Create(ctx, c.job); err != nil {
				t.Fatalf("create: %v", err)
			}
			if diff := cmp.Diff(want.Spec, c.job.Spec); diff != "" {
				t.Errorf("apiserver defaults differ from Default() (-go +apiserver):\n%s", diff)
			}
		})
	}
}
