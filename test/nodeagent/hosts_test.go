package nodeagent

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestTheHostsBlockNamesRunningPodsOnly(t *testing.T) {
	pod := func(name, node string, phase corev1.PodPhase, deleted bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team"},
			Spec:   corev1.PodSpec{Hostname: name, Subdomain: "llm", NodeName: node},
			Status: corev1.PodStatus{Phase: phase, PodIP: "10.244.0." + name[len(name)-1:]}}
		if deleted {
			p.DeletionTimestamp = &metav1.Time{}
		}
		return p
	}
	ours := func(n string) bool { return n == "a" }
	got := hostsBlock([]*corev1.Pod{
		pod("llm-0-1", "a", corev1.PodRunning, false),
		pod("llm-0-0", "a", corev1.PodRunning, false),
		pod("llm-0-2", "a", corev1.PodPending, false),
		pod("llm-0-3", "a", corev1.PodRunning, true),
		pod("llm-0-4", "b", corev1.PodRunning, false),
	}, ours)
	want := []string{
		"127.1.0.0 llm-0-0.llm.team.svc llm-0-0.llm.team.svc.cluster.local",
		"127.1.0.1 llm-0-1.llm.team.svc llm-0-1.llm.team.svc.cluster.local",
	}
	if !slices.Equal(got, want) {
		t.Errorf("block %q, want %q", got, want)
	}
}

func TestTheHostsBlockReplacesOnlyItsOwn(t *testing.T) {
	hosts := "127.0.0.1 localhost\n::1 localhost\n"
	one := withBlock(hosts, "1", []string{"127.1.0.5 a.b.c.svc"})
	both := withBlock(one, "2", []string{"127.1.0.6 d.e.f.svc"})
	moved := withBlock(both, "1", []string{"127.1.0.7 a.b.c.svc"})
	want := "127.0.0.1 localhost\n::1 localhost\n" +
		"# zaya-nodeagent 2 begin\n127.1.0.6 d.e.f.svc\n# zaya-nodeagent 2 end\n" +
		"# zaya-nodeagent 1 begin\n127.1.0.7 a.b.c.svc\n# zaya-nodeagent 1 end\n"
	if moved != want {
		t.Errorf("hosts:\n%s\nwant:\n%s", moved, want)
	}
	if back := withBlock(withBlock(moved, "1", nil), "2", nil); back != hosts {
		t.Errorf("with both blocks removed:\n%q\nwant the file as it was:\n%q", back, hosts)
	}
}
