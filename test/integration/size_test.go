package integration

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// statusWrites counts the status writes of one job.
type statusWrites struct {
	next http.RoundTripper
	path string
	n    atomic.Int32
}

func (s *statusWrites) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodPut && strings.HasSuffix(req.URL.Path, s.path) {
		s.n.Add(1)
	}
	return s.next.RoundTrip(req)
}

// TestAJobTooLargeForItsStatusIsToldOnce: a job the API server stores but whose status no
// longer fits (etcd's 1.5 MiB) is told once, with an event naming what to shorten, and its
// refused status write is not retried in a loop; the job beside it runs.
func TestAJobTooLargeForItsStatusIsToldOnce(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	// The largest job etcd stores, found before the operator starts: no status fits beside it.
	bigJob := func(n int) *trainingv1alpha1.ZayaTrainingJob {
		return testjob.MakeZayaTrainingJob("big", ns).Nodes(1).WorkerEnv("BLOB", strings.Repeat("x", n)).Obj()
	}
	fits, refused := 1400<<10, 1600<<10
	for refused-fits > 16 {
		mid := (fits + refused) / 2
		if err := k8sClient.Create(ctx, bigJob(mid)); err != nil {
			refused = mid
			continue
		}
		fits = mid
		g.Expect(k8sClient.Delete(ctx, bigJob(mid))).To(Succeed())
		g.Eventually(func() error { return k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "big"}, bigJob(0)) }).
			Should(MatchError(ContainSubstring("not found")))
	}
	big := bigJob(fits)
	g.Expect(k8sClient.Create(ctx, big)).To(Succeed())

	writes := &statusWrites{path: "/namespaces/" + ns + "/zayatrainingjobs/big/status"}
	opCfg := rest.CopyConfig(cfg)
	opCfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { writes.next = rt; return writes })
	startManagerAs(t, opCfg)
	small := testjob.MakeZayaTrainingJob("small", ns).Nodes(2).Obj()
	g.Expect(k8sClient.Create(ctx, small)).To(Succeed())
	waitPods(g, ns, "small", 2)

	warnings := func(g Gomega) []string { return eventNotes(g, ns, "big", trainingv1alpha1.ReasonStatusTooLarge) }
	g.Eventually(func(g Gomega) {
		g.Expect(warnings(g)).To(ConsistOf(ContainSubstring("shorten spec.template")))
	}, timeout, interval).Should(Succeed())
	// A retried write would be refused again: a few passes (the pods' and the job's events)
	// may try, a backoff loop would have tried about a dozen times in these seconds.
	g.Consistently(func(g Gomega) {
		g.Expect(writes.n.Load()).To(BeNumerically("<=", 3))
		g.Expect(warnings(g)).To(HaveLen(1))
	}, 5*time.Second, interval).Should(Succeed())
	g.Expect(jobPods(g, ns, "big")).To(BeEmpty())

	// The job beside it is reconciled as usual.
	for _, pod := range jobPods(g, ns, "small") {
		setPodStatus(g, pod, runningReady)
	}
	g.Eventually(func(g Gomega) {
		g.Expect(getJob(g, small).Status.ReadyNodes).To(BeEquivalentTo(2))
	}, timeout, interval).Should(Succeed())
}
