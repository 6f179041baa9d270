package integration

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// apiUse is one (group, resource, verb) the operator asked the API server for.
type apiUse struct{ group, resource, verb string }

func (u apiUse) String() string { return fmt.Sprintf("%s/%s:%s", u.group, u.resource, u.verb) }

// requestRecorder notes every request that goes through it, as the API server's authorizer
// sees it.
type requestRecorder struct {
	next http.RoundTripper
	mu   sync.Mutex
	used sets.Set[apiUse]
}

var requestInfo = &request.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")}

func (r *requestRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	if info, err := requestInfo.NewRequestInfo(req); err == nil && info.IsResourceRequest {
		res := info.Resource
		if info.Subresource != "" {
			res += "/" + info.Subresource
		}
		r.mu.Lock()
		r.used.Insert(apiUse{info.APIGroup, res, info.Verb})
		r.mu.Unlock()
	}
	return r.next.RoundTrip(req)
}

// TestOperatorNeedsExactlyTheGeneratedRBAC runs the operator as a service account holding
// nothing but config/rbac/role.yaml (generated from the +kubebuilder:rbac markers) through a
// job's whole life: checkpoint claim, rendezvous Service, pods refused by Pod Security
// then created, an in-place restart, a node
// found lost by its Lease and quarantined with a taint, its rank's pod force-deleted and
// replaced, success, deletion after its TTL.
// The job gets through it (the grants suffice), and every grant is used (none is spare).
func TestOperatorNeedsExactlyTheGeneratedRBAC(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)

	b, err := os.ReadFile(filepath.Join("..", "..", "config", "rbac", "role.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	role := &rbacv1.ClusterRole{}
	g.Expect(yaml.UnmarshalStrict(b, role)).To(Succeed())
	role.Name = "zaya-rbac-" + ns
	g.Expect(k8sClient.Create(ctx, role)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), role) })
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "zaya-operator", Namespace: "zaya-system"}},
	}
	g.Expect(k8sClient.Create(ctx, binding)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), binding) })

	// The Role for the pod-mark key, in the operator's namespace, with the key not made yet.
	markRole := podMarkRole(t, g)
	patternsRole := namespaceRole(t, g, "failure_patterns_role.yaml")
	g.Expect(patternsRole.Rules[0].ResourceNames).To(ConsistOf(failurePatternsConfigMap.Name))
	g.Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{
		Namespace: podMarkSecret.Namespace, Name: podMarkSecret.Name}}))).To(Succeed())
	g.Expect(markRole.Rules[0].ResourceNames).To(ConsistOf(podMarkSecret.Name))

	nodes := make([]string, 3)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("%s-n%d", ns, i)
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodes[i]}}
		g.Expect(k8sClient.Create(ctx, n)).To(Succeed())
		t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), n) })
		n.Spec.Taints = nil // admission adds not-ready until a kubelet reports; there is none
		g.Expect(k8sClient.Update(ctx, n)).To(Succeed())
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
		g.Expect(k8sClient.Status().Update(ctx, n)).To(Succeed())
	}

	opCfg := rest.CopyConfig(cfg)
	opCfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:zaya-system:zaya-operator",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:zaya-system", "system:authenticated"}}
	rec := &requestRecorder{used: sets.New[apiUse]()}
	opCfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { rec.next = rt; return rec })
	startManagerAs(t, opCfg)

	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).NewCheckpoint("10Gi", "").Profile(trainingv1alpha1.NetworkPollaraAINIC).Obj()
	ft := &job.Spec.FaultTolerance
	ft.Quarantine.NodeTaint = trainingv1alpha1.QuarantineTaintNoSchedule
	ft.TerminatingTimeout = &metav1.Duration{Duration: time.Second}
	job.Spec.TTLSecondsAfterFinished = ptr.To[int32](0)
	// Force deletion is due terminatingTimeout after the grace period ends.
	job.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](1)
	job.Spec.Checkpoint.RetainOnDelete = ptr.To(false) // owned by the job: a sharer co-owns it
	// Pod Security "baseline" refuses the IPC_LOCK capability of the RDMA profile: the operator
	// retries, and its repeated FailedCreate warning becomes an event series (a patch). Once
	// the namespace allows it, the pods are created.
	setEnforce := func(level string) {
		nsObj := &corev1.Namespace{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: ns}, nsObj)).To(Succeed())
		if nsObj.Labels == nil {
			nsObj.Labels = map[string]string{}
		}
		nsObj.Labels["pod-security.kubernetes.io/enforce"] = level
		g.Expect(k8sClient.Update(ctx, nsObj)).To(Succeed())
	}
	setEnforce("baseline")
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	series := apiUse{"events.k8s.io", "events", "patch"}
	g.Eventually(func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return rec.used.Has(series)
	}, timeout, interval).Should(BeTrue(), "the refused pods' repeated warning was not patched into a series")
	setEnforce("privileged")

	// Attempt 0 lands on n0 and n1 and runs.
	pods := waitPods(g, ns, "llm", 2)

	// A second job mounts its claim: the operator makes it a co-owner, so deleting llm (after
	// its TTL, below) keeps the claim for it.
	reader := testjob.MakeZayaTrainingJob("reader", ns).Nodes(1).ClaimCheckpoint("llm-checkpoints").Obj()
	g.Expect(k8sClient.Create(ctx, reader)).To(Succeed())
	g.Eventually(func(g Gomega) {
		claim := &corev1.PersistentVolumeClaim{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "llm-checkpoints"}, claim)).To(Succeed())
		g.Expect(claim.OwnerReferences).To(ConsistOf(HaveField("Name", "llm"), HaveField("Name", "reader")))
	}, timeout, interval).Should(Succeed())
	ks := kubelets(g, ns, 2)
	t0 := time.Now().Add(-time.Minute).Truncate(time.Second)
	for r, node := range nodes[:2] {
		p := pods[fmt.Sprintf("llm-0-%d", r)]
		g.Expect(k8sClient.SubResource("binding").Create(ctx, p, &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: ns},
			Target:     corev1.ObjectReference{Kind: "Node", Name: node},
		})).To(Succeed())
		ks[r].run(t0)
	}
	// Someone strips rank 0's job label: the operator finds its pod by name and labels it again.
	g.Eventually(func(g Gomega) {
		g.Expect(meta.IsStatusConditionTrue(getJob(g, job).Status.Conditions, trainingv1alpha1.ConditionRunning)).To(BeTrue())
	}, timeout, interval).Should(Succeed())
	stripJobLabel(g, ns, "llm-0-0")
	g.Eventually(func(g Gomega) {
		g.Expect(jobPods(g, ns, "llm")).To(HaveKey("llm-0-0"))
	}, timeout, interval).Should(Succeed())

	// n1 freezes: its kubelet's Lease lapses and rank 1 does not restart in place with rank 0,
	// which lost it. Rank 1's node is quarantined and tainted, its pod force-deleted (no
	// kubelet will confirm) and replaced; rank 0 keeps its pod.
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: nodes[1], Namespace: corev1.NamespaceNodeLease},
		Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To[int32](40), RenewTime: ptr.To(metav1.NewMicroTime(t0))}}
	g.Expect(k8sClient.Create(ctx, lease)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), lease) })
	fault := t0.Add(30 * time.Second)
	ks[0].exit(trainingv1alpha1.ExitStopped, fault)
	ks[0].run(fault.Add(time.Second))
	n1 := &corev1.Node{}
	g.Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: nodes[1]}, n1)).To(Succeed())
		g.Expect(n1.Spec.Taints).To(ContainElement(HaveField("Key", trainingv1alpha1.QuarantineTaintKey)))
		now := jobPods(g, ns, "llm")
		g.Expect(slices.Sorted(maps.Keys(now))).To(Equal([]string{"llm-0-0", "llm-0-1"}))
		g.Expect(now["llm-0-0"].UID).To(Equal(pods["llm-0-0"].UID))
		g.Expect(now["llm-0-1"].UID).NotTo(Equal(pods["llm-0-1"].UID))
	}, timeout, interval).Should(Succeed())

	// The new rank 1 runs, rank 0 succeeds: the job completes and is deleted after its TTL of 0.
	pods = jobPods(g, ns, "llm")
	setPodStatus(g, pods["llm-0-1"], runningReady)
	setPodStatus(g, pods["llm-0-0"], corev1.PodStatus{Phase: corev1.PodSucceeded, ContainerStatuses: []corev1.ContainerStatus{{
		Name: "worker", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}},
	}}})
	g.Eventually(func() bool {
		return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(job), &trainingv1alpha1.ZayaTrainingJob{}))
	}, timeout, interval).Should(BeTrue(), "the job did not complete and go after its TTL")

	granted := sets.New[apiUse]()
	for _, r := range slices.Concat(role.Rules, markRole.Rules, patternsRole.Rules) {
		for _, grp := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					granted.Insert(apiUse{grp, res, v})
				}
			}
		}
	}
	rec.mu.Lock()
	used := rec.used.Clone()
	rec.mu.Unlock()
	sorted := func(s sets.Set[apiUse]) []string {
		out := []string{}
		for u := range s {
			out = append(out, u.String())
		}
		sort.Strings(out)
		return out
	}
	g.Expect(sorted(used.Difference(granted))).To(BeEmpty(), "requests outside the generated role (they were refused)")
	// An informer's list is spoken for by its watch: client-go may stream the initial list
	// through the watch (WatchList), but falls back to a plain list on API servers without it.
	for u := range used {
		if u.verb == "watch" {
			used.Insert(apiUse{u.group, u.resource, "list"})
		}
	}
	g.Expect(sorted(granted.Difference(used))).To(BeEmpty(), "grants the operator never used: drop them from the +kubebuilder:rbac markers")
	t.Logf("the operator used: %v", sorted(used))
}

// podMarkRole creates config/rbac/pod_mark_role.yaml's Role and RoleBinding in the operator's
// namespace, for the operator's service account, until the test ends.
func podMarkRole(t *testing.T, g Gomega) *rbacv1.Role {
	return namespaceRole(t, g, "pod_mark_role.yaml")
}

// namespaceRole creates a config/rbac file's Role and RoleBinding in the operator's namespace,
// for the operator's service account, until the test ends.
func namespaceRole(t *testing.T, g Gomega, file string) *rbacv1.Role {
	b, err := os.ReadFile(filepath.Join("..", "..", "config", "rbac", file))
	g.Expect(err).NotTo(HaveOccurred())
	docs := strings.Split(string(b), "\n---\n")
	g.Expect(docs).To(HaveLen(2))
	role, binding := &rbacv1.Role{}, &rbacv1.RoleBinding{}
	g.Expect(yaml.UnmarshalStrict([]byte(docs[0]), role)).To(Succeed())
	g.Expect(yaml.UnmarshalStrict([]byte(docs[1]), binding)).To(Succeed())
	role.Namespace, binding.Namespace = podMarkSecret.Namespace, podMarkSecret.Namespace
	binding.Subjects = []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "zaya-operator", Namespace: podMarkSecret.Namespace}}
	ctx := context.Background()
	for _, o := range []client.Object{role, binding} {
		g.Expect(k8sClient.Create(ctx, o)).To(Succeed())
		t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), o) })
	}
	return role
}
