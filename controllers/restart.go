package controllers

import (
	"context"

	corev1 "k8s.io/api/core/v1"

	"github.com/zaya-operator/zaya-operator/controllers/recovery"
	"github.com/zaya-operator/zaya-operator/controllers/restart"
)

// The core's side of recovery (controllers/restart carries the verdicts out): the pass lends
// the executor its status, events, pod writes and account.

// restarter is the pass's executor of recovery, for a gang whose warm spares are spares.
func (p *pass) restarter(spares []*corev1.Pod) *restart.Executor {
	return &restart.Executor{
		Job: p.job, Now: p.now, Host: p, Spares: spares,
		Cluster: p.r.Client, Live: p.r.apiReader(),
		Patterns: p.r.failurePatterns(), Stopped: p.r.gate().Stopped, Exits: p.exits,
		HardwareTaint: p.r.HardwareTaint, TaintMax: p.r.QuarantineTaintMax, Reach: p.r.Supervisors,
	}
}

// The pass is its executor's Host (its ticket's too: admission.go).
var _ restart.Host = (*pass)(nil)

func (p *pass) Warning(reason, action, format string, args ...any) {
	p.warning(reason, action, format, args...)
}

func (p *pass) WhenStored(record func()) { p.whenStored(record) }

func (p *pass) Loss() restart.Loss { return p.ledger() }

func (p *pass) DeletePods(ctx context.Context, pods []*corev1.Pod, maxGrace *int64) error {
	return p.deletePods(ctx, pods, maxGrace)
}

func (p *pass) NamespaceGoing(ctx context.Context) bool { return p.namespaceGoing(ctx) }

// restarting reports whether a gang restart is under way.
func (p *pass) restarting() bool {
	_, ok := recovery.Restarting(&p.job.Status)
	return ok
}

// exits are the messages of the gang's stopped ranks (none before the pass knows the gang).
func (p *pass) exits() []string {
	if p.stopped == nil {
		return nil
	}
	return p.stopped()
}
