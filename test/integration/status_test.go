package integration

import (
	"context"
	"os"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/yaml"
)

// TestStatusWrittenBySomeoneElseIsRefused: a status that would become an invalid label, a
// negative count or a pod the API server refuses is refused by the schema's bounds.
func TestStatusWrittenBySomeoneElseIsRefused(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	u := manifest(t, `spec: {suspend: true}`)
	u.SetNamespace(ns)
	g.Expect(k8sClient.Create(ctx, u)).To(Succeed())
	for patch, want := range map[string]string{
		`status: {restarts: -1}`:               "status.restarts",
		`status: {restarts: 2147483647}`:       "status.restarts",
		`status: {readyNodes: -4}`:             "status.readyNodes",
		`status: {lastRecoverySeconds: -1}`:    "status.lastRecoverySeconds",
		`status: {lastCheckpoint: {step: -1}}`: "status.lastCheckpoint.step",
		`status: {lastFailure: {time: "2026-01-01T00:00:00Z", reason: ExitCode, attempt: -1, rank: -2}}`:      "status.lastFailure.attempt",
		`status: {quarantinedNodes: [{name: "Node A; rm", reason: NodeLost, since: "2026-01-01T00:00:00Z"}]}`: "status.quarantinedNodes[0].name",
	} {
		p, err := yaml.YAMLToJSON([]byte(patch))
		g.Expect(err).NotTo(HaveOccurred())
		err = k8sClient.Status().Patch(ctx, u.DeepCopy(), rawMergePatch(p))
		g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%s: %v", patch, err)
		if os.Getenv("ZAYA_KUBE_MIN") != "" {
			want = strings.TrimPrefix(want, "status.") // older API servers name the field from below status
		}
		g.Expect(err.Error()).To(ContainSubstring(want), patch)
	}
}
