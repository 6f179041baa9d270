package controllers

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/zaya-operator/zaya-operator/api/contract"
	"github.com/zaya-operator/zaya-operator/controllers/liveprogress"
	"github.com/zaya-operator/zaya-operator/controllers/supervisorprobe"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// byType finds the cache's per-type options (keyed by pointer) by the object's type.
func byType[T any](opts map[client.Object]cache.ByObject) (cache.ByObject, bool) {
	for obj, by := range opts {
		if _, ok := obj.(T); ok {
			return by, true
		}
	}
	return cache.ByObject{}, false
}

func TestCacheKeepsWhatTheReconcilerReads(t *testing.T) {
	opts := CacheOptions()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}}}
	out, err := opts.DefaultTransform(svc)
	if err != nil || len(out.(*corev1.Service).ManagedFields) != 0 {
		t.Errorf("managedFields kept in the cache: %v %v", out, err)
	}

	// A worker pod as the API server returns it: everything the operator wrote, plus what the
	// scheduler and kubelet add. The cache keeps metadata, status, node, grace period, restart
	// policy and container names, and drops the rest.
	job := testjob.MakeZayaTrainingJob("j", "ns").Nodes(4).NewCheckpoint("1Ti", "").Defaulted().Obj()
	job.Spec.FaultTolerance.HangTimeout = &metav1.Duration{Duration: time.Hour}
	pod := newWorkerPod(job, workerpod.NetworkEnv(&job.Spec), 2)
	pod.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "zaya-operator"}}
	pod.Spec.NodeName = "node-7"
	pod.Spec.TerminationGracePeriodSeconds = ptr.To[int64](30)
	pod.Status = corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{Name: "worker",
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: "zaya: checkpoint 40"}}}}}
	want := pod.DeepCopy()
	want.ManagedFields = nil
	want.Spec = corev1.PodSpec{NodeName: "node-7", TerminationGracePeriodSeconds: ptr.To[int64](30), RestartPolicy: corev1.RestartPolicyNever,
		Containers: []corev1.Container{{Name: "worker", RestartPolicy: pod.Spec.Containers[0].RestartPolicy, RestartPolicyRules: pod.Spec.Containers[0].RestartPolicyRules}}}
	by, ok := byType[*corev1.Pod](opts.ByObject)
	if !ok || by.Transform == nil || by.Label == nil || by.Label.Empty() {
		t.Fatalf("pods are cached without a label selector and transform: %+v", by)
	}
	out, err = by.Transform(pod)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("cached pod (-want +got):\n%s", diff)
	}
	if !by.Label.Matches(labels.Set(want.Labels)) || by.Label.Matches(labels.Set{"app": "other"}) {
		t.Errorf("selector %v: our pods must match, others must not", by.Label)
	}

	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
		Status: corev1.NodeStatus{Images: []corev1.ContainerImage{{Names: []string{"big"}}}}}
	nodes, ok := byType[*corev1.Node](opts.ByObject)
	if !ok || nodes.Transform == nil {
		t.Fatal("nodes have no transform")
	}
	out, err = nodes.Transform(node)
	if err != nil || len(out.(*corev1.Node).ManagedFields) != 0 || len(out.(*corev1.Node).Status.Images) != 0 {
		t.Errorf("node not slimmed: %v %v", out, err)
	}
}

// TestSlimPodKeepsWhatTheReconcilerReads: the cache's pods keep what a pass decides on —
// Kueue's admission gate among them (Queued) — and drop the bulk.
func TestSlimPodKeepsWhatTheReconcilerReads(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		NodeName: "n1", RestartPolicy: corev1.RestartPolicyNever,
		SchedulingGates: []corev1.PodSchedulingGate{{Name: "kueue.x-k8s.io/admission"}},
		Containers:      []corev1.Container{{Name: "worker", Image: "w", Env: []corev1.EnvVar{{Name: "A", Value: "b"}}}},
		Volumes:         []corev1.Volume{{Name: "v"}},
	}}
	out, err := slimPod(pod)
	if err != nil {
		t.Fatal(err)
	}
	slim := out.(*corev1.Pod)
	if len(slim.Spec.SchedulingGates) != 1 || slim.Spec.SchedulingGates[0].Name != "kueue.x-k8s.io/admission" {
		t.Errorf("scheduling gates %v: a gated pod from the cache would not be queued", slim.Spec.SchedulingGates)
	}
	if slim.Spec.NodeName != "n1" || slim.Spec.Containers[0].Name != "worker" {
		t.Errorf("kept too little: %+v", slim.Spec)
	}
	if len(slim.Spec.Volumes) > 0 || len(slim.Spec.Containers[0].Env) > 0 {
		t.Errorf("kept the bulk: %+v", slim.Spec)
	}
}

// A rank on the host's network is never polled: its address is the node's, and whatever
// serves port 9400 there is not the worker. The check reads the pod as the cache keeps it.
func TestAHostNetworkRankIsNeverPolledFromTheCache(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{HostNetwork: true, NodeName: "n1", Containers: []corev1.Container{{Name: "worker"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.7", HostIP: "10.0.0.7"}}
	slim, err := slimPod(pod.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	cached := slim.(*corev1.Pod)
	if !cached.Spec.HostNetwork {
		t.Error("the cache drops spec.hostNetwork")
	}
	cached.Spec.HostNetwork = false // a pod whose spec says nothing, on the node's address all the same
	if addr := liveprogress.Addr(cached); addr != "" {
		t.Errorf("a rank on the node's address is polled at %s", addr)
	}
}

// The supervisor's declared port is what says the operator may ask it (supervisorprobe.Addr),
// and the operator reads pods from the cache: the port survives the slimming, nothing else of
// the ports does.
func TestTheSupervisorsPortSurvivesTheCache(t *testing.T) {
	port := corev1.ContainerPort{Name: contract.SupervisorPortName, ContainerPort: contract.SupervisorPort, Protocol: corev1.ProtocolTCP}
	pod := &corev1.Pod{Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "worker",
		Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9400}, port}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.1.7", HostIP: "172.18.0.3"}}
	slim, err := slimPod(pod)
	if err != nil {
		t.Fatal(err)
	}
	cached := slim.(*corev1.Pod)
	if got := cached.Spec.Containers[0].Ports; len(got) != 1 || got[0] != port {
		t.Errorf("cached ports %+v, want the supervisor's alone", got)
	}
	if addr := supervisorprobe.Addr(cached); addr != "10.244.1.7:29511" {
		t.Errorf("the cached pod's supervisor is asked at %q", addr)
	}
}
