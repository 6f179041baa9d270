package controllers

import (
	"fmt"
	"strings"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/bounded"
)

// Status is partly other people's word: anyone with status access may store any value the
// schema accepts, and the operator adds to what it finds. Every counter it adds to saturates
// at the schema's bound, and what it cannot keep is dropped before the write, so the status it
// computes is always one its own CRD accepts (TestTheOperatorNeverWritesAStatusItsSchemaRefuses).

// maxConditions is the schema's bound on status.conditions.
const maxConditions = 16

// boundStatus drops what the schema would refuse in the status the pass computed and says
// what it dropped: conditions past the bound that are not the operator's (sorted last).
func (p *pass) boundStatus() {
	st := &p.job.Status
	if len(st.Conditions) <= maxConditions {
		return
	}
	sortConditions(st.Conditions)
	var dropped []string
	for _, c := range st.Conditions[maxConditions:] {
		dropped = append(dropped, c.Type)
	}
	st.Conditions = st.Conditions[:maxConditions]
	p.warning(trainingv1alpha1.ReasonInvalidSpec, "Status", "%s", bounded.Message(fmt.Sprintf(
		"dropped condition(s) %s from status: the operator's own need room within the %d the schema allows", strings.Join(dropped, ", "), maxConditions)))
}
