package controllers

import (
	"context"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

// rulesSupport is the API server's answer on restart rules, shared by every job: whether a
// pod created with them comes back with them. It asks again after rulesRecheck (the cluster
// may be upgraded under the operator) and, after an error, assumes they are kept (an exit the
// kubelet did not restart is still caught: InPlaceUnsupported) and asks again sooner.
type rulesSupport struct {
	mu      sync.Mutex
	known   bool
	isKept  bool
	asked   time.Time
	checked time.Time
}

const (
	rulesRecheck = 10 * time.Minute
	rulesRetry   = time.Minute
)

// kept reports whether the API server keeps container restart rules, asking it through c with
// a dry-run pod in namespace when the last answer (as of now) is stale.
func (s *rulesSupport) kept(ctx context.Context, c client.Writer, now time.Time, namespace string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if (s.known && now.Sub(s.checked) < rulesRecheck) || (!s.known && !s.asked.IsZero() && now.Sub(s.asked) < rulesRetry) {
		return !s.known || s.isKept
	}
	s.asked = now
	probe := recovery.RulesProbe(namespace)
	if err := c.Create(ctx, probe, client.DryRunAll); recovery.RefusesRestartRules(err) {
		// Before 1.34 the API server knows restartPolicy on init containers (sidecars) only,
		// and refuses it on others: an answer, not an error.
		s.known, s.checked, s.isKept = true, now, false
		return false
	} else if err != nil {
		log.FromContext(ctx).Info("could not ask the API server whether it keeps container restart rules; assuming it does", "error", err.Error())
		s.known = false
		return true
	}
	s.known, s.checked = true, now
	s.isKept = recovery.RulesKept(probe)
	return s.isKept
}
