package controllers

import (
	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

// judgeStragglers sets the Straggling condition from rank 0's latest report (recovery.Stragglers)
// and returns the verdict that replaces the straggler, when that is due.
func (p *pass) judgeStragglers(g gang.Gang) *recovery.Verdict {
	s, ok := recovery.Stragglers(p.job, g, p.report, p.ledger().TrainingSince(), p.now)
	switch {
	case !ok:
		return nil
	case !s.Found:
		p.clearCondition(trainingv1alpha1.ConditionStraggling, trainingv1alpha1.ReasonNoStraggler, s.Message)
		return nil
	}
	if p.becameTrue(trainingv1alpha1.ConditionStraggling, trainingv1alpha1.ReasonStragglerDetected, s.Message) {
		p.warning(trainingv1alpha1.ReasonStragglerDetected, "Detect", "%s", s.Detail)
	}
	return s.Replace
}
