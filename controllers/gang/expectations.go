package gang

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
)

// ExpectationTTL is how long a created pod that the cache has not shown yet is trusted to
// exist; after it the rank counts as missing again (the pod may have been deleted before any
// pass saw it). Watches lag by milliseconds, and by over 10 s in a 2048-pod launch on 2 cores.
const ExpectationTTL = 30 * time.Second

// Creations remembers the pods this process created that its cache has not shown yet, so a
// pass that runs before the watch catches up does not create them again: at 2048 ranks that
// was over a thousand AlreadyExists round trips per launch.
type Creations struct {
	mu   sync.Mutex
	jobs map[types.NamespacedName]*jobCreations
}

type jobCreations struct {
	uid   types.UID            // a re-created job of the same name starts afresh
	names map[string]time.Time // pod name → created at
}

func (c *Creations) of(job *trainingv1alpha1.ZayaTrainingJob) *jobCreations {
	key := types.NamespacedName{Namespace: job.Namespace, Name: job.Name}
	if c.jobs == nil {
		c.jobs = map[types.NamespacedName]*jobCreations{}
	}
	jc := c.jobs[key]
	if jc == nil || jc.uid != job.UID {
		jc = &jobCreations{uid: job.UID, names: map[string]time.Time{}}
		c.jobs[key] = jc
	}
	return jc
}

// Pending returns, of the missing ranks, those to create now, and when the earliest
// held-back one expires (0 if none is held back). Pods the cache shows, and expectations
// past their TTL, are forgotten.
func (c *Creations) Pending(job *trainingv1alpha1.ZayaTrainingJob, g Gang, missing []int32, now time.Time) ([]int32, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := c.of(job).names
	if len(seen) == 0 {
		return missing, 0
	}
	for _, pod := range g.Ranks {
		if pod != nil {
			delete(seen, pod.Name)
		}
	}
	for name, at := range seen {
		if now.Sub(at) >= ExpectationTTL {
			delete(seen, name)
		}
	}
	var out []int32
	var next time.Duration
	for _, r := range missing {
		at, ok := seen[workerpod.PodName(job, job.Status.Attempt(), r)]
		if !ok {
			out = append(out, r)
			continue
		}
		if left := ExpectationTTL - now.Sub(at); next == 0 || left < next {
			next = left
		}
	}
	return out, next
}

// Created remembers a pod this process created, by name, and when.
func (c *Creations) Created(job *trainingv1alpha1.ZayaTrainingJob, name string, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.of(job).names[name] = at
}

// Deleting drops the expectation of a pod being deleted: the cache showed it, though perhaps
// never to a pass that creates (a rank first seen failed), and its rank's next pod is new.
func (c *Creations) Deleting(job *trainingv1alpha1.ZayaTrainingJob, name string) {
	c.mu.Lock()
	delete(c.of(job).names, name)
	c.mu.Unlock()
}

// Forget drops a deleted job's expectations.
func (c *Creations) Forget(key types.NamespacedName) {
	c.mu.Lock()
	delete(c.jobs, key)
	c.mu.Unlock()
}
