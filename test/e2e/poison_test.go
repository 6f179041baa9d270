//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// pillCopies is how many of each poison pill the test stores.
const pillCopies = 5

// TestPoisonPillsCannotStopTheOperator stores jobs Go cannot decode next to a running job,
// then restarts the operator: the new process syncs, keeps reconciling the healthy job (an
// edit, a rank failure), reports each pill on itself, and stays up, idle and small.
func TestPoisonPillsCannotStopTheOperator(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	job := runningJob(t, ns, "healthy", nil)

	pills, err := testjob.StorePoisonPills(ctx, k8sClient, ns, "pill", pillCopies)
	t.Cleanup(func() {
		for _, u := range pills {
			_ = k8sClient.Delete(ctx, u)
		}
	})
	g.Expect(err).NotTo(HaveOccurred())

	// A fresh operator must sync with the pills stored.
	pid, alive := w.restartOperator(t, g)

	// The healthy job: an edit is observed, a failed rank restarts the gang.
	g.Expect(k8sClient.Patch(ctx, job, client.RawPatch("application/merge-patch+json",
		[]byte(`{"spec":{"faultTolerance":{"maxRestarts":5}}}`)))).To(Succeed())
	g.Eventually(func(g Gomega) {
		got := getJob(g, job)
		g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
	}, timeout, interval).Should(Succeed())
	w.exitWorker(g, rankPods(g, job, 0)["1"], 1)
	waitRunning(g, job, 1)

	for i, u := range pills {
		want := testjob.PoisonPills[i%len(testjob.PoisonPills)].Field + ":"
		g.Eventually(func(g Gomega) {
			got := u.DeepCopy()
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(u), got)).To(Succeed())
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			g.Expect(conds).To(ContainElement(And(
				HaveKeyWithValue("type", trainingv1alpha1.ConditionCreated),
				HaveKeyWithValue("status", string(metav1.ConditionFalse)),
				HaveKeyWithValue("reason", trainingv1alpha1.ReasonInvalidSpec),
				HaveKeyWithValue("message", ContainSubstring(want)),
			)), "%s", u.GetName())
		}, timeout, interval).Should(Succeed())
	}

	// Up, idle and small: the quantity pill alone would hold a core and grow without end.
	cpu0 := cpuSeconds(g, pid)
	time.Sleep(5 * time.Second)
	busy := cpuSeconds(g, pid) - cpu0
	if err := alive(); err != nil {
		t.Fatal(err)
	}
	rss := rssMiB(g, pid)
	t.Logf("operator with %d pills stored: %.2f CPU seconds in 5 idle seconds, %.0f MiB resident", len(pills), busy, rss)
	g.Expect(busy).To(BeNumerically("<", 2.5), "operator CPU over 5 idle seconds")
	g.Expect(rss).To(BeNumerically("<", 512), "operator resident memory, MiB")
}

// cpuSeconds is the user and system CPU time a process has used.
func cpuSeconds(g Gomega, pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	g.Expect(err).NotTo(HaveOccurred())
	// Fields after the command name, which is in parentheses and may hold spaces.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	g.Expect(err1).NotTo(HaveOccurred())
	g.Expect(err2).NotTo(HaveOccurred())
	return (utime + stime) / 100 // USER_HZ is 100 on Linux
}

// rssMiB is a process's resident memory.
func rssMiB(g Gomega, pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	g.Expect(err).NotTo(HaveOccurred())
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			g.Expect(err).NotTo(HaveOccurred())
			return kb / 1024
		}
	}
	g.Expect("VmRSS").To(BeEmpty(), "no VmRSS in /proc/%d/status", pid)
	return 0
}
