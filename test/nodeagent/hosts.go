package nodeagent

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Pod DNS as a cluster answers it, where Options.HostsFile is set: the agent writes the pod
// DNS names of its running pods (<hostname>.<subdomain>.<namespace>.svc[.cluster.local]) with
// their addresses into a block of the hosts file, and the processes' environment keeps the
// names, as a real kubelet's does. A process resolves a name when it dials, so one that
// retries a peer whose pod was replaced (same name, a new address) reaches the new pod once
// it runs. Without it the agent puts the address into the environment when the process
// starts, and such a retry dials the old address for ever (the chaos soak: a replaced rank 0
// kept its peers, restarted in place a moment before, dialling its dead predecessor until
// their heartbeat probes killed them, a restart no fault caused).

// hostsMu serialises the agents of one test process writing the one file.
var hostsMu sync.Mutex

// hostsPublishEvery is how often the block follows the pods.
const hostsPublishEvery = 100 * time.Millisecond

// hostsBlock is the lines for the running pods among pods that have a DNS name, sorted.
func hostsBlock(pods []*corev1.Pod, ours func(node string) bool) []string {
	var lines []string
	for _, p := range pods {
		if p.Spec.Hostname == "" || p.Spec.Subdomain == "" || p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning ||
			p.Status.PodIP == "" || !ours(p.Spec.NodeName) {
			continue
		}
		name := p.Spec.Hostname + "." + p.Spec.Subdomain + "." + p.Namespace + ".svc"
		lines = append(lines, processIP(p.Status.PodIP)+" "+name+" "+name+".cluster.local")
	}
	slices.Sort(lines)
	return lines
}

// withBlock is hosts with the block marked id replaced by lines (removed when lines is nil).
func withBlock(hosts, id string, lines []string) string {
	begin, end := "# zaya-nodeagent "+id+" begin", "# zaya-nodeagent "+id+" end"
	var out []string
	in := false
	for line := range strings.Lines(hosts) {
		switch t := strings.TrimRight(line, "\n"); {
		case t == begin:
			in = true
		case t == end:
			in = false
		case !in:
			out = append(out, t)
		}
	}
	if len(lines) > 0 {
		out = append(out, begin)
		out = append(out, lines...)
		out = append(out, end)
	}
	if len(out) == 0 {
		return ""
	}
	return strings.Join(out, "\n") + "\n"
}

// publishHosts keeps the agent's block of the hosts file in step with its pods until ctx
// ends, then removes it.
func (a *Agent) publishHosts(ctx context.Context) {
	t := time.NewTicker(hostsPublishEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if err := a.writeHosts(nil); err != nil {
				a.opts.Logf("nodeagent: writing %s: %v", a.opts.HostsFile, err)
			}
			return
		case <-t.C:
			a.syncHosts()
		}
	}
}

// syncHosts writes the block if the running pods changed since it was last written.
func (a *Agent) syncHosts() {
	pods, err := a.pods.List(labels.Everything())
	if err != nil {
		return
	}
	lines := hostsBlock(pods, func(n string) bool { return a.nodeOf[n] })
	a.mu.Lock()
	same := slices.Equal(lines, a.hostsLines) && a.hostsLines != nil
	a.mu.Unlock()
	if same {
		return
	}
	if err := a.writeHosts(lines); err != nil {
		a.opts.Logf("nodeagent: writing %s: %v", a.opts.HostsFile, err)
		return
	}
	a.mu.Lock()
	a.hostsLines = append([]string{}, lines...)
	a.mu.Unlock()
}

// writeHosts replaces the agent's block in place (the file may be a bind mount, which a
// rename cannot replace).
func (a *Agent) writeHosts(lines []string) error {
	hostsMu.Lock()
	defer hostsMu.Unlock()
	b, err := os.ReadFile(a.opts.HostsFile)
	if err != nil {
		return err
	}
	next := withBlock(string(b), a.hostsID, lines)
	if next == string(b) {
		return nil
	}
	return os.WriteFile(a.opts.HostsFile, []byte(next), 0o644)
}

// newHostsID names an agent's block: unique among the agents writing one file.
func newHostsID() string { return fmt.Sprintf("%d-%d", os.Getpid(), time.Now().UnixNano()) }

// RemoveHosts takes the agent's block out of the hosts file at once (its context's end does
// too, but a test process may exit first).
func (a *Agent) RemoveHosts() error {
	if a.opts.HostsFile == "" {
		return nil
	}
	return a.writeHosts(nil)
}
