package controllers

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// Anyone who may create pods in a job's namespace can copy its labels and controller reference
// onto a pod of their own. The operator marks every pod it creates with an HMAC of the pod's
// identity under a key tenants cannot read, so such a pod never counts as a rank: it is named
// as a conflict instead, and never deleted.

// markKeyField is the Secret key holding the HMAC key.
const markKeyField = "key"

// markKeyBytes is the size of a generated key.
const markKeyBytes = 32

// markKey signs the pods this operator creates.
type markKey struct {
	key []byte
	// since is when the key came to be (the Secret's server-set creation time): a pod created
	// before it was made by an operator that did not mark pods, or whose key is gone, and is
	// trusted as before. A tenant cannot make a pod older than the key.
	since time.Time
	// v1Until is when this process loaded the key: a pod an earlier version marked by name
	// alone ("v1.") is trusted if created before it, while such marks were all there was.
	v1Until time.Time
	// valid remembers the marks found valid: a pass reads every rank, and an HMAC each was
	// most of a 2,048-rank pass's CPU. Only valid marks are kept (only the key makes them), up
	// to maxValidMarks.
	valid validMarks
}

// maxValidMarks bounds the remembered marks: past it they are forgotten and checked again.
const maxValidMarks = 1 << 17

// validMarks is a set of HMAC inputs with the mark each signed.
type validMarks struct {
	mu sync.Mutex
	m  map[string]struct{}
}

func (v *validMarks) has(k string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	_, ok := v.m[k]
	return ok
}

func (v *validMarks) add(k string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.m == nil || len(v.m) >= maxValidMarks {
		v.m = map[string]struct{}{}
	}
	v.m[k] = struct{}{}
}

// A mark binds to one pod, not to its name: an in-place replacement makes a pod of the same
// name, so a mark copied from a deleted pod onto a new one of that name must not pass. The
// mark signs when it was issued, and holds only for a pod the API server created within
// markWindow of that (creationTimestamp is the server's, no tenant sets it): a copy made once
// the original is gone, minutes or hours later, is no rank.

// markWindow is how far a marked pod's creation may be from its mark's issue: the operator
// marks a pod the moment before it sends it (not at the start of its pass, which takes seconds
// at 2,048 ranks), so this covers the request and the clocks' difference. A replay must come
// within it of the original's creation, with the original already gone.
const markWindow = time.Minute

// podMark is the mark of the pod of job, attempt and rank named name, issued at unix second at.
func (k *markKey) podMark(jobUID types.UID, attempt, rank, name string, at int64) string {
	h := hmac.New(sha256.New, k.key)
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\x00%d", jobUID, attempt, rank, name, at)
	return fmt.Sprintf("v2.%d.%s", at, base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:16]))
}

// stamp marks a pod this operator is about to create, now.
func (k *markKey) stamp(job *trainingv1alpha1.ZayaTrainingJob, pod *corev1.Pod, now time.Time) {
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[trainingv1alpha1.PodMarkAnnotation] = k.podMark(job.UID,
		pod.Labels[trainingv1alpha1.AttemptLabel], pod.Labels[trainingv1alpha1.RankLabel], pod.Name, now.Unix())
}

// made reports whether this operator made pod for the job of jobUID: controlled by that job
// and either marked with the key or older than it.
func (k *markKey) made(jobUID types.UID, pod metav1.Object) bool {
	ref := metav1.GetControllerOf(pod)
	if ref == nil || ref.UID != jobUID {
		return false
	}
	return pod.GetCreationTimestamp().Time.Before(k.since) || k.marked(jobUID, pod)
}

// marked reports whether pod carries the mark of a pod of the job of jobUID, issued within
// markWindow of the pod's creation.
func (k *markKey) marked(jobUID types.UID, pod metav1.Object) bool {
	mark := pod.GetAnnotations()[trainingv1alpha1.PodMarkAnnotation]
	created := pod.GetCreationTimestamp().Time
	if strings.HasPrefix(mark, "v1.") {
		h := hmac.New(sha256.New, k.key)
		fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s", jobUID, pod.GetLabels()[trainingv1alpha1.AttemptLabel], pod.GetLabels()[trainingv1alpha1.RankLabel], pod.GetName())
		return created.Before(k.v1Until) && hmac.Equal([]byte(mark), []byte("v1."+base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:16])))
	}
	rest, ok := strings.CutPrefix(mark, "v2.")
	at, _, _ := strings.Cut(rest, ".")
	issued, err := strconv.ParseInt(at, 10, 64)
	if !ok || err != nil {
		return false
	}
	attempt, rank := pod.GetLabels()[trainingv1alpha1.AttemptLabel], pod.GetLabels()[trainingv1alpha1.RankLabel]
	// Every input of the HMAC, and the mark: a pod whose labels or mark change is checked anew.
	seen := strings.Join([]string{string(jobUID), attempt, rank, pod.GetName(), mark}, "\x00")
	if !k.valid.has(seen) {
		if !hmac.Equal([]byte(mark), []byte(k.podMark(jobUID, attempt, rank, pod.GetName(), issued))) {
			return false
		}
		k.valid.add(seen)
	}
	return created.IsZero() || created.Sub(time.Unix(issued, 0)).Abs() <= markWindow
}

// orphaned reports whether pod, controlled by nothing, carries this operator's mark for a pod
// of the job of jobUID: it was one of that job's ranks until it was orphaned.
func (k *markKey) orphaned(jobUID types.UID, pod metav1.Object) bool {
	return metav1.GetControllerOf(pod) == nil && k.marked(jobUID, pod)
}

// ownPods splits the listed pods into those this operator made for the job and the others. It
// filters pods in place (copying 2,048 pods' structs was half a pass's mark check): own
// reuses pods' array, and the others are copied out before their slots are overwritten.
func (k *markKey) ownPods(job *trainingv1alpha1.ZayaTrainingJob, pods []corev1.Pod) (own []corev1.Pod, foreign []*corev1.Pod) {
	own = pods[:0]
	for i := range pods {
		switch {
		case !k.made(job.UID, &pods[i]):
			f := pods[i]
			foreign = append(foreign, &f)
		case len(own) == i: // no other pod before it: it stays where it is
			own = pods[:i+1]
		default:
			own = append(own, pods[i])
		}
	}
	return own, foreign
}

// markKeys loads the key once per process, after the operator became leader: an operator of
// an older version that still runs during an upgrade stops before the key comes to be, so every
// unmarked pod it made is older than the key.
type markKeys struct {
	mu  sync.Mutex
	key *markKey
}

// get is the key pods are marked with: kept in the Secret name (created through c on first use;
// read through reader), or, without one, made in memory (pods that existed before this process
// are trusted).
func (m *markKeys) get(ctx context.Context, c client.Writer, reader client.Reader, name types.NamespacedName, clk clock.PassiveClock) (*markKey, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.key != nil {
		return m.key, nil
	}
	k, err := loadMarkKey(ctx, c, reader, name, clk)
	if err != nil {
		return nil, err
	}
	m.key = k
	return k, nil
}

func loadMarkKey(ctx context.Context, c client.Writer, reader client.Reader, name types.NamespacedName, clk clock.PassiveClock) (*markKey, error) {
	if name.Name == "" {
		key, err := newMarkKey()
		return &markKey{key: key, since: clk.Now(), v1Until: clk.Now()}, err
	}
	// Read directly: caching Secrets would watch every Secret the operator may see.
	secret := &corev1.Secret{}
	err := reader.Get(ctx, name, secret)
	if apierrors.IsNotFound(err) {
		key, kerr := newMarkKey()
		if kerr != nil {
			return nil, kerr
		}
		secret = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: name.Name,
				Labels: map[string]string{"app.kubernetes.io/name": "zaya-operator", "app.kubernetes.io/component": "pod-mark-key"}},
			Data: map[string][]byte{markKeyField: key},
		}
		err = c.Create(ctx, secret)
		if apierrors.IsAlreadyExists(err) { // another replica made it first
			err = reader.Get(ctx, name, secret)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("reading the pod-mark key Secret %s: %w", name, err)
	}
	key := secret.Data[markKeyField]
	if len(key) < markKeyBytes {
		return nil, fmt.Errorf("the pod-mark key Secret %s holds no %d-byte %q: delete it and the operator makes a new one", name, markKeyBytes, markKeyField)
	}
	return &markKey{key: key, since: secret.CreationTimestamp.Time, v1Until: clk.Now()}, nil
}

func newMarkKey() ([]byte, error) {
	key := make([]byte, markKeyBytes)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("making a pod-mark key: %w", err)
	}
	return key, nil
}

// ParseNamespacedName reads a flag naming an object of the operator's: namespace/name.
func ParseNamespacedName(s string) (types.NamespacedName, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return types.NamespacedName{}, fmt.Errorf("%q: want namespace/name", s)
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}
