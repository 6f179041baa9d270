package workerpod

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// forbidden is what the apiserver's own Pod Security checks refuse in pod at level.
func forbidden(t *testing.T, level api.Level, pod *corev1.Pod) []string {
	t.Helper()
	eval, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range eval.EvaluatePod(api.LevelVersion{Level: level, Version: api.LatestVersion()}, &pod.ObjectMeta, &pod.Spec) {
		if !r.Allowed {
			out = append(out, r.ForbiddenReason+": "+r.ForbiddenDetail)
		}
	}
	slices.Sort(out)
	return out
}

// nonRootTemplate is what a template adds to run under "restricted": a non-root user and a
// seccomp profile. The operator fills in the rest.
func nonRootTemplate(w *testjob.Wrapper) *testjob.Wrapper {
	w.Spec.Template.Spec.SecurityContext = &corev1.PodSecurityContext{
		RunAsNonRoot:   ptr.To(true),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	return w
}

// TestWorkerPodsMeetPodSecurity checks worker pods with the apiserver's Pod Security
// evaluator: a template that runs as non-root with a seccomp profile yields pods that pass
// "restricted" (the operator adds no privilege escalation and drops capabilities itself),
// except for IPC_LOCK on RDMA profiles, which is the one thing it adds that restricted and
// baseline refuse, and which network.ipcLock=false leaves out.
func TestWorkerPodsMeetPodSecurity(t *testing.T) {
	withInit := func(w *testjob.Wrapper) *testjob.Wrapper {
		w.Spec.Template.Spec.InitContainers = []corev1.Container{{Name: "fetch", Image: "busybox"}}
		return w
	}
	ipcLockRefused := []string{"non-default capabilities: container \"worker\" must not include \"IPC_LOCK\" in securityContext.capabilities.add"}
	cases := []struct {
		name       string
		job        *trainingv1alpha1.ZayaTrainingJob
		restricted []string
		baseline   []string
	}{
		{"socket, non-root template", nonRootTemplate(testjob.MakeZayaTrainingJob("j", "ns").Profile(trainingv1alpha1.NetworkSocket)).Obj(), nil, nil},
		{"socket, non-root template with an init container", withInit(nonRootTemplate(testjob.MakeZayaTrainingJob("j", "ns").Profile(trainingv1alpha1.NetworkSocket))).Obj(), nil, nil},
		{"pollara, non-root, ipcLock false", func() *trainingv1alpha1.ZayaTrainingJob {
			j := nonRootTemplate(testjob.MakeZayaTrainingJob("j", "ns")).Obj()
			j.Spec.Network.IPCLock = ptr.To(false)
			return j
		}(), nil, nil},
		{"pollara, non-root: IPC_LOCK", nonRootTemplate(testjob.MakeZayaTrainingJob("j", "ns")).Obj(),
			[]string{"unrestricted capabilities: container \"worker\" must not include \"IPC_LOCK\" in securityContext.capabilities.add"}, ipcLockRefused},
		{"roce, root template: baseline refuses only IPC_LOCK", testjob.MakeZayaTrainingJob("j", "ns").Profile(trainingv1alpha1.NetworkRoCE).Obj(),
			[]string{
				"runAsNonRoot != true: pod or container \"worker\" must set securityContext.runAsNonRoot=true",
				"seccompProfile: pod or container \"worker\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\"",
				"unrestricted capabilities: container \"worker\" must set securityContext.capabilities.drop=[\"ALL\"]; container \"worker\" must not include \"IPC_LOCK\" in securityContext.capabilities.add",
			}, ipcLockRefused},
		{"socket, root template: baseline passes", testjob.MakeZayaTrainingJob("j", "ns").Profile(trainingv1alpha1.NetworkSocket).Obj(),
			[]string{
				"runAsNonRoot != true: pod or container \"worker\" must set securityContext.runAsNonRoot=true",
				"seccompProfile: pod or container \"worker\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\"",
				"unrestricted capabilities: container \"worker\" must set securityContext.capabilities.drop=[\"ALL\"]",
			}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.job.Default()
			pod := Render(c.job, NetworkEnv(&c.job.Spec), 0)
			if diff := cmp.Diff(c.restricted, forbidden(t, api.LevelRestricted, pod)); diff != "" {
				t.Errorf("restricted refuses (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(c.baseline, forbidden(t, api.LevelBaseline, pod)); diff != "" {
				t.Errorf("baseline refuses (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRestrictByDefaultKeepsTheTemplatesChoices(t *testing.T) {
	nonRoot := &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](1000)}
	cases := []struct {
		name string
		in   *corev1.SecurityContext
		pod  *corev1.PodSecurityContext
		want *corev1.SecurityContext
	}{
		{"root: no escalation, capabilities kept", nil, nil,
			&corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false)}},
		{"non-root pod: capabilities dropped", nil, nonRoot,
			&corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}},
		{"container runs as root in a non-root pod", &corev1.SecurityContext{RunAsUser: ptr.To[int64](0)}, nonRoot,
			&corev1.SecurityContext{RunAsUser: ptr.To[int64](0), AllowPrivilegeEscalation: ptr.To(false)}},
		{"template's own drops kept", &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"NET_RAW"}}}, nonRoot,
			&corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"NET_RAW"}}}},
		{"privileged: left alone (the API refuses no-escalation with it)", &corev1.SecurityContext{Privileged: ptr.To(true)}, nonRoot,
			&corev1.SecurityContext{Privileged: ptr.To(true)}},
		{"SYS_ADMIN: escalation left open", &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_ADMIN"}}}, nil,
			&corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_ADMIN"}}}},
		{"explicit escalation kept", &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(true)}, nil,
			&corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(true)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctr := &corev1.Container{Name: "w", SecurityContext: c.in}
			restrictByDefault(ctr, c.pod)
			if diff := cmp.Diff(c.want, ctr.SecurityContext); diff != "" {
				t.Errorf("security context (-want +got):\n%s", diff)
			}
		})
	}
}
