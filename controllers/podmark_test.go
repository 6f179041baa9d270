package controllers

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

func TestAMarkIsBoundToTheJobAttemptRankAndName(t *testing.T) {
	k := &markKey{key: []byte("0123456789abcdef0123456789abcdef"), since: now}
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Defaulted().Obj()
	job.UID = "job-uid"
	made := func(name, rank, attempt string) *corev1.Pod {
		p := newWorkerPod(job, nil, 0)
		p.Name, p.Labels[trainingv1alpha1.RankLabel], p.Labels[trainingv1alpha1.AttemptLabel] = name, rank, attempt
		p.CreationTimestamp = metav1.NewTime(now.Add(time.Second))
		k.stamp(job, p, now)
		return p
	}
	pod := made("llm-0-0", "0", "0")
	if !k.made(job.UID, pod) {
		t.Fatal("the operator's own pod is not its own")
	}

	copied := func(name, rank, attempt string) *corev1.Pod {
		p := made(name, rank, attempt)
		p.Annotations[trainingv1alpha1.PodMarkAnnotation] = pod.Annotations[trainingv1alpha1.PodMarkAnnotation]
		return p
	}
	for what, p := range map[string]*corev1.Pod{
		"another rank":    copied("llm-0-0", "1", "0"),
		"another attempt": copied("llm-0-0", "0", "1"),
		"another name":    copied("llm-0-9", "0", "0"),
		"no mark": func() *corev1.Pod {
			p := made("llm-0-0", "0", "0")
			delete(p.Annotations, trainingv1alpha1.PodMarkAnnotation)
			return p
		}(),
		"another key": func() *corev1.Pod {
			p := made("llm-0-0", "0", "0")
			other := &markKey{key: []byte("fedcba9876543210fedcba9876543210")}
			other.stamp(job, p, now)
			return p
		}(),
	} {
		if k.made(job.UID, p) {
			t.Errorf("a pod with a mark copied to %s counts as the job's", what)
		}
	}
	if k.made("another-job", pod) {
		t.Error("a pod counts for a job that does not control it")
	}
	// Replayed: the rank's pod was deleted (an in-place replacement reuses its name) and a
	// tenant made a pod of that name an hour later with everything copied, mark included.
	replay := pod.DeepCopy()
	replay.CreationTimestamp = metav1.NewTime(now.Add(time.Hour))
	if k.made(job.UID, replay) {
		t.Error("a pod made later under a replaced rank's name, with its mark copied, counts as the rank")
	}
	replay.CreationTimestamp = metav1.NewTime(now.Add(markWindow + 2*time.Second))
	if k.made(job.UID, replay) {
		t.Errorf("a replay %v after the mark's issue counts as the rank", markWindow+2*time.Second)
	}
	// Marks by name alone (an earlier version's) hold for pods made before this process.
	v1 := &markKey{key: k.key, since: now, v1Until: now.Add(time.Minute)}
	legacy := made("llm-0-0", "0", "0")
	{
		h := hmac.New(sha256.New, k.key)
		fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s", job.UID, "0", "0", "llm-0-0")
		legacy.Annotations[trainingv1alpha1.PodMarkAnnotation] = "v1." + base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:16])
	}
	if !v1.made(job.UID, legacy) {
		t.Error("a pod an earlier version marked is not trusted after the upgrade")
	}
	legacy.CreationTimestamp = metav1.NewTime(now.Add(time.Hour))
	if v1.made(job.UID, legacy) {
		t.Error("an earlier version's mark copied onto a pod made after the upgrade counts")
	}

	old := made("llm-0-0", "0", "0")
	delete(old.Annotations, trainingv1alpha1.PodMarkAnnotation)
	old.CreationTimestamp = metav1.NewTime(now.Add(-time.Second))
	if !k.made(job.UID, old) {
		t.Error("a pod older than the key (made before pods were marked) is not trusted")
	}
	old.OwnerReferences = nil
	if k.made(job.UID, old) {
		t.Error("an old pod without the job's controller reference counts")
	}
}

func TestThePodMarkKeyIsMadeOnceAndKept(t *testing.T) {
	ctx := context.Background()
	cl := fake.NewClientBuilder().WithScheme(testScheme()).Build()
	name := types.NamespacedName{Namespace: "zaya-system", Name: "zaya-operator-pod-mark"}
	newReconciler := func() *ZayaTrainingJobReconciler {
		return &ZayaTrainingJobReconciler{Client: cl, Clock: clocktesting.NewFakePassiveClock(now), PodMarkSecret: name}
	}
	first, err := newReconciler().podMarkKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	second, err := newReconciler().podMarkKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if string(first.key) != string(second.key) || len(first.key) != markKeyBytes {
		t.Fatal("a restarted operator does not read the key it made")
	}

	secret := &corev1.Secret{}
	if err := cl.Get(ctx, name, secret); err != nil {
		t.Fatal(err)
	}
	secret.Data[markKeyField] = []byte("short")
	if err := cl.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	if _, err := newReconciler().podMarkKey(ctx); err == nil {
		t.Fatal("a key too short to be safe was used")
	}

	inMemory := &ZayaTrainingJobReconciler{Client: cl, Clock: clocktesting.NewFakePassiveClock(now)}
	k, err := inMemory.podMarkKey(ctx)
	if err != nil || len(k.key) != markKeyBytes || !k.since.Equal(now) {
		t.Fatalf("in-memory key: %v, %d bytes since %v", err, len(k.key), k.since)
	}
}

func TestParseNamespacedName(t *testing.T) {
	if got, err := ParseNamespacedName("zaya-system/key"); err != nil || got != (types.NamespacedName{Namespace: "zaya-system", Name: "key"}) {
		t.Errorf("got %v, %v", got, err)
	}
	for _, bad := range []string{"", "key", "/key", "ns/", "a/b/c"} {
		if _, err := ParseNamespacedName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// BenchmarkOwnPods is the mark check of a pass over a gang of 2,048 ranks, each pass after the
// first (a pass reads every rank's pod).
func BenchmarkOwnPods(b *testing.B) {
	k := &markKey{key: []byte("0123456789abcdef0123456789abcdef"), since: now}
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2048).Defaulted().Obj()
	job.UID = "job-uid"
	pods := make([]corev1.Pod, 2048)
	for r := range pods {
		p := newWorkerPod(job, nil, int32(r))
		p.CreationTimestamp = metav1.NewTime(now.Add(time.Second))
		p.OwnerReferences[0].UID = job.UID
		k.stamp(job, p, now)
		pods[r] = *p
	}
	if own, _ := k.ownPods(job, pods); len(own) != len(pods) {
		b.Fatalf("%d of %d pods are the job's", len(own), len(pods))
	}
	b.ReportAllocs()
	for b.Loop() {
		k.ownPods(job, pods)
	}
}

// ownPods filters in place: the job's pods keep their order, and the others are reported as
// they were, not as the slots the job's pods moved into.
func TestOwnPodsSplitsInPlace(t *testing.T) {
	k := &markKey{key: []byte("0123456789abcdef0123456789abcdef"), since: now}
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(5).Defaulted().Obj()
	job.UID = "job-uid"
	var pods []corev1.Pod
	for r := range int32(5) {
		p := newWorkerPod(job, nil, r)
		p.CreationTimestamp = metav1.NewTime(now.Add(time.Second))
		p.OwnerReferences[0].UID = job.UID
		if r%2 == 0 {
			k.stamp(job, p, now)
		}
		pods = append(pods, *p)
	}
	own, foreign := k.ownPods(job, pods)
	var ownNames, foreignNames []string
	for _, p := range own {
		ownNames = append(ownNames, p.Name)
	}
	for _, p := range foreign {
		foreignNames = append(foreignNames, p.Name)
	}
	if want := []string{"llm-0-0", "llm-0-2", "llm-0-4"}; fmt.Sprint(ownNames) != fmt.Sprint(want) {
		t.Errorf("own %v, want %v", ownNames, want)
	}
	if want := []string{"llm-0-1", "llm-0-3"}; fmt.Sprint(foreignNames) != fmt.Sprint(want) {
		t.Errorf("foreign %v, want %v", foreignNames, want)
	}
}
