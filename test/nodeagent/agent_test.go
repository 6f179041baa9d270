package nodeagent

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestExpandFollowsKubernetesRules(t *testing.T) {
	vars := map[string]string{"NODE_RANK": "3", "EMPTY": ""}
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	for in, want := range map[string]string{
		"rank-$(NODE_RANK)":        "rank-3",
		"$(EMPTY)x":                "x",
		"$(MISSING)":               "$(MISSING)",
		"$$(NODE_RANK)":            "$(NODE_RANK)",
		"cost $5":                  "cost $5",
		"open $(NODE_RANK":         "open $(NODE_RANK",
		"$(NODE_RANK)$(NODE_RANK)": "33",
	} {
		if got := expand(in, lookup); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRewriteMapsOnlyWholePaths(t *testing.T) {
	paths := []mapping{{"/dev/termination-log", "/h/term"}, {"/checkpoints", "/h/ckpt"}, {"/dev/shm", "/h/shm"}}
	for in, want := range map[string]string{
		"/checkpoints":                     "/h/ckpt",
		"-params-out=/checkpoints/final":   "-params-out=/h/ckpt/final",
		"/checkpoints-old/x":               "/checkpoints-old/x",
		"/data/checkpoints":                "/data/checkpoints",
		`echo hi >> /dev/termination-log;`: `echo hi >> /h/term;`,
		"/dev/shm/zaya-heartbeat":          "/h/shm/zaya-heartbeat",
	} {
		if got := rewrite(in, paths); got != want {
			t.Errorf("rewrite(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPodDNSNames(t *testing.T) {
	for in, ok := range map[string]bool{
		"llm-0.llm.team.svc": true, "llm-0.llm.team.svc.cluster.local": true,
		"llm-0.llm.team": false, "10.0.0.1": false, "llm.team.svc": false,
	} {
		if got := podDNS.MatchString(in); got != ok {
			t.Errorf("%q matched %v, want %v", in, got, ok)
		}
	}
	a := &Agent{}
	self := &corev1.Pod{Spec: corev1.PodSpec{Hostname: "llm-0", Subdomain: "llm"}}
	if got := a.resolve(self, "127.1.0.9", "team", "llm-0", "llm"); got != "127.1.0.9" {
		t.Errorf("a pod resolves its own name to %q", got)
	}
}
