//go:build e2e

package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/zaya-operator/zaya-operator/test/nodeagent"
)

// gracefulWorker starts, waits for the test's go-ahead before it turns ready (its readiness
// probe looks for /data/ready), and on SIGTERM makes a final save that takes a moment (as a
// rank's last checkpoint does) and exits 0. SIGKILL leaves no /data/final.
const gracefulWorker = `trap 'echo term > /data/term; sleep 2; echo saved > /data/final; exit 0' TERM
touch /data/started
until [ -e /data/go ]; do sleep 0.1; done
touch /data/ready
while :; do sleep 0.1; done`

// TestProcessNodesAreTheNodeAgentsAlone: a process-backed node has one kubelet, the node
// agent. kwok is configured to leave it alone; every status write on the node, its Lease and
// its pod is the agent's; the pod turns Ready only once its process passes its readiness
// probe; and deleting the pod gives its process SIGTERM and its grace period, so its final
// save finishes, instead of a force-delete and SIGKILL.
func TestProcessNodesAreTheNodeAgentsAlone(t *testing.T) {
	kwokOnly(t, "it tests test/nodeagent, the kubelet imitation kind does not need")
	g := NewWithT(t)
	ctx := context.Background()
	a := processCluster(t, 1)
	node := a.Nodes()[0]
	cs := clientset(t)
	ns := newNamespace(t)

	n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	expectKwokLeavesAlone(t, g, n)

	// Every version of the pod, from before it exists until it is gone.
	const name = "graceful"
	w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	g.Expect(err).NotTo(HaveOccurred())
	defer w.Stop()
	var (
		mu      sync.Mutex
		history []*corev1.Pod
		gone    = make(chan *corev1.Pod, 1)
		ended   = make(chan struct{})
	)
	go func() {
		defer close(ended)
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			mu.Lock()
			history = append(history, p)
			mu.Unlock()
			if ev.Type == watch.Deleted {
				gone <- p
				return
			}
		}
	}()
	seen := func() []*corev1.Pod {
		mu.Lock()
		defer mu.Unlock()
		return append([]*corev1.Pod(nil), history...)
	}

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{corev1.LabelHostname: node},
			Tolerations:                   []corev1.Toleration{{Key: agentLabel, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			AutomountServiceAccountToken:  ptr.To(false),
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](60),
			Volumes:                       []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			Containers: []corev1.Container{{
				Name: "worker", Image: "busybox", Command: []string{"sh", "-c", gracefulWorker},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"test", "-f", "/data/ready"}}},
					PeriodSeconds: 1,
				},
			}},
		},
	}
	// The namespace's default ServiceAccount appears a moment after the namespace.
	g.Eventually(func() error {
		_, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		return err
	}, timeout, interval).Should(Succeed())

	// Running: the process is up, reported Running by the agent, and not Ready, since its probe
	// has not passed.
	var data string
	g.Eventually(func(g Gomega) {
		data = ""
		if dir := a.PodDir(ns, name); dir != "" {
			data = filepath.Join(dir, "volumes", "data")
		}
		g.Expect(data).NotTo(BeEmpty())
		g.Expect(filepath.Join(data, "started")).To(BeAnExistingFile())
		h := seen()
		g.Expect(h).NotTo(BeEmpty())
		g.Expect(h[len(h)-1].Status.Phase).To(Equal(corev1.PodRunning))
	}, timeout, interval).Should(Succeed())
	for _, p := range seen() {
		g.Expect(podReady(p)).To(BeFalse(), "pod %s was reported Ready before its process was (rv %s, status written by %v)", name, p.ResourceVersion, statusWriters(p.ManagedFields))
	}

	// Ready once the process says so.
	g.Expect(os.WriteFile(filepath.Join(data, "go"), nil, 0o644)).To(Succeed())
	g.Eventually(func(g Gomega) {
		h := seen()
		g.Expect(h).NotTo(BeEmpty())
		g.Expect(podReady(h[len(h)-1])).To(BeTrue())
	}, timeout, interval).Should(Succeed())

	// Deleted with a grace period: SIGTERM, the final save, exit 0, then the pod goes.
	g.Expect(cs.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](60)})).To(Succeed())
	var last *corev1.Pod
	g.Eventually(gone, timeout).Should(Receive(&last), "pod %s was not removed after its process ended", name)
	<-ended
	g.Expect(filepath.Join(data, "term")).To(BeAnExistingFile(), "the worker never got SIGTERM")
	g.Expect(filepath.Join(data, "final")).To(BeAnExistingFile(), "the worker's final save did not finish: it was killed inside its grace period")
	g.Expect(last.Status.ContainerStatuses).To(HaveLen(1), "the pod was removed before its container's exit was reported: %+v", last.Status)
	term := last.Status.ContainerStatuses[0].State.Terminated
	g.Expect(term).NotTo(BeNil(), "the pod was removed while its container ran: %+v", last.Status)
	g.Expect(term.ExitCode).To(BeZero(), "the worker exited %d (137: SIGKILL)", term.ExitCode)
	g.Expect(last.Status.Phase).To(Equal(corev1.PodSucceeded))

	// Nobody but the agent wrote any of it.
	for _, p := range seen() {
		expectOnlyAgentWrites(g, "pod "+name+" rv "+p.ResourceVersion, p.ManagedFields, true)
	}
	n, err = cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(n.Annotations).NotTo(HaveKey(nodeagent.KwokNodeAnnotation))
	expectOnlyAgentWrites(g, "node "+node, n.ManagedFields, false)
	lease, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, node, metav1.GetOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ptr.Deref(lease.Spec.HolderIdentity, "")).To(Equal(node), "node %s's Lease is held by someone else", node)
	for _, f := range lease.ManagedFields {
		g.Expect(f.Manager).To(Equal(nodeagent.FieldManager), "node %s's Lease written by %s", node, f.Manager)
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// statusWriters are the managers of an object's status.
func statusWriters(fields []metav1.ManagedFieldsEntry) []string {
	var out []string
	for _, f := range fields {
		if f.Subresource == "status" {
			out = append(out, f.Manager)
		}
	}
	return out
}

// expectOnlyAgentWrites: every status write is the agent's, and kwok wrote nothing at all. On
// a pod the scheduler may also have written status, but only its scheduling condition
// (PodScheduled=False while no node fits): never the phase, readiness or containers.
func expectOnlyAgentWrites(g Gomega, what string, fields []metav1.ManagedFieldsEntry, pod bool) {
	for _, f := range fields {
		g.Expect(strings.ToLower(f.Manager)).NotTo(ContainSubstring("kwok"), "%s written by %s: %+v", what, f.Manager, f)
		if f.Subresource != "status" {
			continue
		}
		if pod && f.Manager == "kube-scheduler" && f.FieldsV1 != nil {
			owned := f.FieldsV1.GetRawString()
			for _, kubelets := range []string{`"f:phase"`, `"f:containerStatuses"`, `\"type\":\"Ready\"`, `"f:podIP"`} {
				g.Expect(owned).NotTo(ContainSubstring(kubelets), "%s: the scheduler owns a kubelet's status field: %s", what, owned)
			}
			continue
		}
		g.Expect(f.Manager).To(Equal(nodeagent.FieldManager), "%s's status written by %s", what, f.Manager)
	}
}

// expectKwokLeavesAlone reads the kwok controller's arguments from the kwokctl cluster's saved
// configuration next to the kubeconfig (hack/cluster.sh) and checks that kwok manages only
// nodes its selector picks, that node (a process node) is not one of them, and the fake
// MI300X nodes are. Other clusters (no kwokctl) skip this part.
func expectKwokLeavesAlone(t *testing.T, g Gomega, node *corev1.Node) {
	t.Helper()
	args, err := kwokControllerArgs(filepath.Join(filepath.Dir(kubeconfig), "kwok.yaml"))
	if errors.Is(err, os.ErrNotExist) {
		t.Logf("not a kwokctl cluster (%v): kwok's configuration not checked", err)
		return
	}
	g.Expect(err).NotTo(HaveOccurred())
	flag := func(name string) string {
		v := ""
		for _, a := range args { // the last one wins, as for any flag
			if rest, ok := strings.CutPrefix(a, "--"+name+"="); ok {
				v = rest
			}
		}
		return v
	}
	g.Expect(flag("manage-all-nodes")).To(Equal("false"), "kwok manages every node, process nodes included: %q", args)
	g.Expect(flag("manage-single-node")).To(BeEmpty())
	annotations, byLabel := flag("manage-nodes-with-annotation-selector"), flag("manage-nodes-with-label-selector")
	g.Expect(annotations+byLabel).NotTo(BeEmpty(), "kwok has no node selector: %q", args)
	manages := func(n *corev1.Node) bool {
		for _, s := range []struct {
			expr string
			set  map[string]string
		}{{annotations, n.Annotations}, {byLabel, n.Labels}} {
			if s.expr == "" {
				continue
			}
			sel, err := labels.Parse(s.expr)
			g.Expect(err).NotTo(HaveOccurred())
			if !sel.Matches(labels.Set(s.set)) {
				return false
			}
		}
		return true
	}
	g.Expect(manages(node)).To(BeFalse(), "kwok's selector (annotations %q, labels %q) picks process node %s", annotations, byLabel, node.Name)
	fake := &corev1.NodeList{}
	g.Expect(k8sClient.List(context.Background(), fake, client.HasLabels{"kwok.x-k8s.io/kwokctl-scale"})).To(Succeed())
	g.Expect(fake.Items).NotTo(BeEmpty())
	for i := range fake.Items {
		g.Expect(manages(&fake.Items[i])).To(BeTrue(), "kwok's selector misses fake node %s", fake.Items[i].Name)
	}
}

// kwokControllerArgs are the kwok-controller component's arguments in a kwokctl cluster's
// saved configuration (a YAML stream; the KwokctlConfiguration lists the components).
func kwokControllerArgs(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	for _, doc := range strings.Split(string(b), "\n---") {
		var conf struct {
			Kind       string `json:"kind"`
			Components []struct {
				Name string   `json:"name"`
				Args []string `json:"args"`
			} `json:"components"`
		}
		if err := yaml.Unmarshal([]byte(doc), &conf); err != nil {
			return nil, err
		}
		if conf.Kind != "KwokctlConfiguration" {
			continue
		}
		for _, c := range conf.Components {
			if c.Name == "kwok-controller" {
				return c.Args, nil
			}
		}
	}
	return nil, errors.New(path + " has no kwok-controller component")
}
