package controllers

import (
	"context"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

// What restarts a worker in its pod (faultTolerance.inPlaceMechanism), and how the operator
// reads it back. Either way the kubelet restarts the container, so the operator sees every
// in-place restart the same way (restartCount, the exit, the termination message):
//   - RestartRules: the worker container's restart rules (KEP-5307), on the API server's word
//     that it keeps them (rulesSupport finds out before pods are made);
//   - Supervisor: the pod's restartPolicy OnFailure restarts any failed container, and
//     zaya-supervisor in the worker container turns an exit the rule does not restart into
//     exit 0 plus an "exit-code=N" line (workers/supervisor), read back by recovery.SupervisorExits.

// decideMechanism sets status.restartMechanism before this pass creates any pod, asking the
// API server (once in a while, for the whole operator) whether it keeps restart rules.
func (p *pass) decideMechanism(ctx context.Context) {
	st := &p.job.Status
	m := recovery.WantedMechanism(&p.job.Spec.FaultTolerance)
	if m == trainingv1alpha1.RestartMechanismRestartRules && !p.r.rules.kept(ctx, p.r.Client, p.r.Clock.Now(), p.job.Namespace) {
		m = trainingv1alpha1.RestartMechanismRecreate
		if st.RestartMechanism != m {
			p.warning(trainingv1alpha1.ReasonInPlaceUnsupported, "Create",
				"the API server drops or refuses container restart rules (Kubernetes before 1.35, or the ContainerRestartRules feature gate is off): "+
					"this job restarts by recreating its pods; faultTolerance.inPlaceMechanism: Supervisor restarts in place on any version")
		}
	}
	st.RestartMechanism = m
}
