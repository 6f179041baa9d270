//go:build e2e

package e2e

import (
	"context"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

func TestSamplesAreAppliedAndAccepted(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)

	out, err := kubectl("apply", "--server-side", "-n", ns, "-k", filepath.Join(repoRoot, "config", "samples"))
	g.Expect(err).NotTo(HaveOccurred(), out)

	out, err = kubectl("wait", "-n", ns, "--for=condition=Created", "--timeout=30s", "ztj", "--all")
	g.Expect(err).NotTo(HaveOccurred(), out)

	jobs := &trainingv1alpha1.ZayaTrainingJobList{}
	g.Expect(k8sClient.List(context.Background(), jobs, clientInNamespace(ns))).To(Succeed())
	g.Expect(jobs.Items).To(HaveLen(4))
	for _, j := range jobs.Items {
		c := meta.FindStatusCondition(j.Status.Conditions, trainingv1alpha1.ConditionCreated)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue), j.Name)
		g.Expect(j.Status.ObservedGeneration).To(Equal(j.Generation), j.Name)
	}

	// The short name and printer columns work as the README shows them.
	out, err = kubectl("get", "ztj", "-n", ns)
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).To(MatchRegexp(`NAME\s+NODES\s+GPUS/NODE\s+CURRENT\s+READY\s+RESTARTS\s+STATUS\s+CHECKPOINT\s+GOODPUT\s+AGE`))
	// STATUS is the most significant true condition: the small job may already run, the
	// 128-node one cannot fit the cluster.
	g.Expect(out).To(MatchRegexp(`zaya1\s+128\s+8\s+128\s+\d+\s+\d+\s+(Created|WaitingForCapacity)\s`))
	g.Expect(out).To(MatchRegexp(`smoke\s+2\s+8\s+2\s+\d+\s+\d+\s+(Created|Running)\s`))
}

func TestKubectlApplyRefusesABadJob(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	bad := `
apiVersion: training.zaya.dev/v1alpha1
kind: ZayaTrainingJob
metadata:
  name: bad
spec:
  nodes: 3
  parallelism: {contextParallel: 5}
  network: {profile: Socket, nicsPerNode: 2}
  template:
    spec:
      containers: [{name: worker, image: zaya-worker:test}]
`
	out, err := kubectlIn(bad, "apply", "--server-side", "-n", ns, "-f", "-")
	g.Expect(err).To(HaveOccurred(), "kubectl accepted an invalid job")
	g.Expect(out).To(ContainSubstring("spec.parallelism.contextParallel"))
	g.Expect(out).To(ContainSubstring("must divide the world size"))
	g.Expect(out).To(ContainSubstring("spec.network.nicsPerNode"))
	g.Expect(out).To(ContainSubstring("must be 0 with the Socket profile"))
}

func TestExplainReadsTheFieldDocs(t *testing.T) {
	g := NewWithT(t)
	out, err := kubectl("explain", "ztj.spec.network.profile")
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).To(ContainSubstring("PollaraAINIC"))
	g.Expect(out).To(ContainSubstring("rails"))
}

func TestInstallManifestsAreValid(t *testing.T) {
	g := NewWithT(t)
	// A server-side dry run checks every object against the live API, but cannot create the
	// namespace the others need. On kind the chart's install has it (and owns the CRD's
	// fields: the dry run takes them).
	if _, err := kubectl("get", "namespace", "zaya-system"); err != nil {
		out, err := kubectl("create", "namespace", "zaya-system")
		g.Expect(err).NotTo(HaveOccurred(), out)
		t.Cleanup(func() { _, _ = kubectl("delete", "namespace", "zaya-system", "--wait=false") })
	}
	out, err := kubectl("apply", "--server-side", "--force-conflicts", "--dry-run=server", "-k", filepath.Join(repoRoot, "config", "default"))
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).To(ContainSubstring("deployment.apps/zaya-operator-controller-manager serverside-applied (server dry run)"))
	g.Expect(out).To(ContainSubstring("clusterrole.rbac.authorization.k8s.io/zaya-operator-manager-role serverside-applied (server dry run)"))
}
