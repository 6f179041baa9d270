package nodeagent

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

func TestExpandFollowsKubernetesRules(t *testing.T) {
	vars := map[string]string{"NODE_RANK": "3", "EMPTY": ""}
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	for in, want := range map[string]string{
		"rank-$(NODE_RANK)":        "rank-3",
		"$(EMPTY)x":                "x",
		"$(MISSING)":               "$(MISSING)",
		"$$(NODE_RANK)":            "$(NODE_RANK)",
		"cost $5":                  "cost $5",
		"open $(NODE_RANK":         "open $(NODE_RANK",
		"$(NODE_RANK)$(NODE_RANK)": "33",
	} {
		if got := expand(in, lookup); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRewriteMapsOnlyWholePaths(t *testing.T) {
	paths := []mapping{{"/dev/termination-log", "/h/term"}, {"/checkpoints", "/h/ckpt"}, {"/dev/shm", "/h/shm"}}
	for in, want := range map[string]string{
		"/checkpoints":                     "/h/ckpt",
		"-params-out=/checkpoints/final":   "-params-out=/h/ckpt/final",
		"/checkpoints-old/x":               "/checkpoints-old/x",
		"/data/checkpoints":                "/data/checkpoints",
		`echo hi >> /dev/termination-log;`: `echo hi >> /h/term;`,
		"/dev/shm/zaya-heartbeat":          "/h/shm/zaya-heartbeat",
	} {
		if got := rewrite(in, paths); got != want {
			t.Errorf("rewrite(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPodDNSNames(t *testing.T) {
	for in, ok := range map[string]bool{
		"llm-0.llm.team.svc": true, "llm-0.llm.team.svc.cluster.local": true,
		"llm-0.llm.team": false, "10.0.0.1": false, "llm.team.svc": false,
	} {
		if got := podDNS.MatchString(in); got != ok {
			t.Errorf("%q matched %v, want %v", in, got, ok)
		}
	}
	a := &Agent{}
	self := &corev1.Pod{Spec: corev1.PodSpec{Hostname: "llm-0", Subdomain: "llm"}}
	if got := a.resolve(self, "127.1.0.9", "team", "llm-0", "llm"); got != "127.1.0.9" {
		t.Errorf("a pod resolves its own name to %q", got)
	}
}

func TestHTTPProbeUsesThePodAddressAndNamedPort(t *testing.T) {
	var status atomic.Int32
	status.Store(http.StatusOK)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		w.WriteHeader(int(status.Load()))
	}))
	defer srv.Close()
	host, portStr, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(portStr)
	r := &run{ip: host, container: corev1.Container{Ports: []corev1.ContainerPort{{Name: "probes", ContainerPort: int32(port)}}}}
	a := &Agent{}
	probe := func(path string, p intstr.IntOrString) error {
		return a.probeOnce(context.Background(), r, &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
			HTTPGet: &corev1.HTTPGetAction{Path: path, Port: p}}}, time.Second)
	}
	if err := probe("/readyz", intstr.FromString("probes")); err != nil {
		t.Errorf("named port: %v", err)
	}
	if err := probe("/readyz", intstr.FromInt32(int32(port))); err != nil {
		t.Errorf("numbered port: %v", err)
	}
	if err := probe("/nope", intstr.FromString("probes")); err == nil {
		t.Error("a 404 passed")
	}
	if err := probe("/readyz", intstr.FromString("metrics")); err == nil {
		t.Error("an unknown port name passed")
	}
	status.Store(http.StatusServiceUnavailable)
	if err := probe("/readyz", intstr.FromString("probes")); err == nil {
		t.Error("a 503 passed")
	}
	status.Store(http.StatusFound)
	if err := probe("/readyz", intstr.FromString("probes")); err != nil {
		t.Errorf("a 302 failed: %v", err)
	}
}

// A node and Lease that kwok (or anyone) left under the agent's node name become the agent's:
// the node loses kwok's annotation, so kwok stops playing its kubelet, and the agent holds the
// Lease under the node's name.
func TestRegisterTakesOverANodeAndItsLease(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{KwokNodeAnnotation: "fake", "keep": "me"}}},
		&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "n", Namespace: corev1.NamespaceNodeLease},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("kwok-controller")}},
	)
	a := &Agent{opts: Options{Client: cs, Labels: map[string]string{"pool": "p"}}, gpus: map[string]int64{"n": gpuCapacity}, down: map[string]bool{}}
	if err := a.register(ctx, "n"); err != nil {
		t.Fatal(err)
	}
	n, err := cs.CoreV1().Nodes().Get(ctx, "n", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := n.Annotations[KwokNodeAnnotation]; ok {
		t.Errorf("the node still carries %s: kwok would manage it", KwokNodeAnnotation)
	}
	if n.Annotations["keep"] != "me" || n.Labels["pool"] != "p" {
		t.Errorf("annotations %v, labels %v", n.Annotations, n.Labels)
	}
	if len(n.Status.Conditions) != 1 || n.Status.Conditions[0].Type != corev1.NodeReady || n.Status.Conditions[0].Status != corev1.ConditionTrue {
		t.Errorf("conditions %+v, want Ready", n.Status.Conditions)
	}
	l, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, "n", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := ptr.Deref(l.Spec.HolderIdentity, ""); got != "n" || l.Spec.RenewTime == nil {
		t.Errorf("lease held by %q, renewed %v; want the node's name, renewed", got, l.Spec.RenewTime)
	}

	// A fresh node carries no kwok annotation either, and gets its Lease.
	if err := a.register(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	if m, err := cs.CoreV1().Nodes().Get(ctx, "m", metav1.GetOptions{}); err != nil || m.Annotations[KwokNodeAnnotation] != "" {
		t.Errorf("new node: %v, annotations %v", err, m.Annotations)
	}
	if l, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, "m", metav1.GetOptions{}); err != nil || ptr.Deref(l.Spec.HolderIdentity, "") != "m" {
		t.Errorf("new node's lease: %v %+v", err, l)
	}
}

// A configMap volume holds the ConfigMap's keys as files, as the kubelet writes them: every
// key, or the items' keys at their paths with their modes (the PyTorch example mounts its
// script so).
func TestAConfigMapVolumeHoldsItsKeys(t *testing.T) {
	cs := fake.NewClientset(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "code", Namespace: "ns"},
		Data: map[string]string{"train.py": "print('hi')\n", "other": "x"}})
	a := &Agent{opts: Options{Client: cs}}
	dir := t.TempDir()
	if err := a.writeConfigMap("ns", &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "code"}}, dir); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "train.py")); err != nil || string(b) != "print('hi')\n" {
		t.Errorf("train.py = %q, %v", b, err)
	}
	items := &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "code"},
		Items: []corev1.KeyToPath{{Key: "train.py", Path: "app/run.py", Mode: ptr.To[int32](0o500)}}}
	dir = t.TempDir()
	if err := a.writeConfigMap("ns", items, dir); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "app/run.py")); err != nil || fi.Mode().Perm() != 0o500 {
		t.Errorf("app/run.py: %v, %v; want mode 0500", fi, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "other")); !os.IsNotExist(err) {
		t.Errorf("a key not among the items was written: %v", err)
	}
	missing := &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "gone"}}
	if err := a.writeConfigMap("ns", missing, t.TempDir()); err == nil {
		t.Error("a missing ConfigMap did not fail the start")
	}
	missing.Optional = ptr.To(true)
	if err := a.writeConfigMap("ns", missing, t.TempDir()); err != nil {
		t.Errorf("an optional missing ConfigMap: %v", err)
	}
}
