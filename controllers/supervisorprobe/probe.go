// Package supervisorprobe asks a rank's zaya-supervisor, from the operator's side of the
// network, whether it still runs (contract.SupervisorPath): a second look at a rank its peers
// stopped over, to tell a lost node from a status that is only late
// (docs/design/fast-node-loss.md). The decision is recovery.LaggardFate's; this package only
// asks and reports what came back.
//
// A tenant's pod answers, so only the supervisor's fixed line counts as an answer: one GET to
// the pod's own address, no redirects, no proxy but the one configured, short deadlines, and
// a few bytes read.
package supervisorprobe

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/zaya-operator/zaya-operator/api/contract"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
)

// Addr is where pod's supervisor answers ("" where it cannot be asked): a running pod on the
// pod network (gang.PodNetworkIP) whose worker container declares contract.SupervisorPort
// under its name, which only an injected supervisor's pod does.
func Addr(pod *corev1.Pod) string {
	ip := gang.PodNetworkIP(pod)
	if ip == "" || len(pod.Spec.Containers) == 0 {
		return ""
	}
	for _, p := range pod.Spec.Containers[workerpod.WorkerContainer(&pod.Spec)].Ports {
		if p.Name == contract.SupervisorPortName && p.ContainerPort == contract.SupervisorPort &&
			(p.Protocol == "" || p.Protocol == corev1.ProtocolTCP) {
			return net.JoinHostPort(ip, strconv.Itoa(contract.SupervisorPort))
		}
	}
	return ""
}

// Prober asks supervisors. Its zero value asks directly, twice at once, within 750 ms.
type Prober struct {
	// Proxy is the HTTP proxy through which pod addresses are reached (nil: directly).
	Proxy *url.URL
	// Timeout bounds the ask; Tries counts the connections made at once (at least 2: one
	// lost SYN is no silence).
	Timeout time.Duration
	Tries   int

	once   sync.Once
	client *http.Client
}

// answerLine is what a supervisor answers.
var answerLine = []byte(contract.SupervisorAnswer)

func (p *Prober) http() *http.Client {
	p.once.Do(func() {
		tr := &http.Transport{
			// A lost node answers no SYN: the dial's own deadline is the try's.
			DialContext:            (&net.Dialer{}).DialContext,
			DisableKeepAlives:      true, // a new connection each time: an old one proves nothing
			DisableCompression:     true,
			MaxResponseHeaderBytes: 4 << 10,
		}
		if p.Proxy != nil {
			tr.Proxy = http.ProxyURL(p.Proxy)
		}
		p.client = &http.Client{
			Transport:     tr,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	})
	return p.client
}

// Ask asks each pod's supervisor at once and reports, in pods' order, what came back: its
// answer (Answered), a refusal from its pod's address (Alive: a live kernel there, no
// supervisor listening: a container that is restarting), nothing within the tries (Silent),
// or Unknown where the pod cannot be asked or what came back proves neither.
func (p *Prober) Ask(ctx context.Context, pods ...*corev1.Pod) []recovery.Reach {
	out := make([]recovery.Reach, len(pods))
	var wg sync.WaitGroup
	for i, pod := range pods {
		addr := Addr(pod)
		if addr == "" {
			continue
		}
		wg.Go(func() { out[i] = p.ask(ctx, addr) })
	}
	wg.Wait()
	return out
}

// ask tries addr Tries times at once: a silence only where every try was silent, an answer or
// a refusal where any came back. At once, not one after another: the peers found the rank
// silent for the peer timeout already, and every second here is the gang's; two
// connections still lose no answer to one dropped packet.
func (p *Prober) ask(ctx context.Context, addr string) recovery.Reach {
	tries, timeout := max(p.Tries, 2), p.Timeout
	if timeout <= 0 {
		timeout = 750 * time.Millisecond
	}
	got := make([]recovery.Reach, tries)
	var wg sync.WaitGroup
	for i := range tries {
		wg.Go(func() { got[i] = p.try(ctx, addr, timeout) })
	}
	wg.Wait()
	switch {
	case slices.Contains(got, recovery.ReachAnswered):
		return recovery.ReachAnswered
	case slices.Contains(got, recovery.ReachAlive):
		return recovery.ReachAlive
	case !slices.ContainsFunc(got, func(r recovery.Reach) bool { return r != recovery.ReachSilent }):
		return recovery.ReachSilent
	}
	return recovery.ReachUnknown
}

// try makes one GET within timeout.
func (p *Prober) try(ctx context.Context, addr string, timeout time.Duration) recovery.Reach {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	u := url.URL{Scheme: "http", Host: addr, Path: contract.SupervisorPath}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return recovery.ReachUnknown
	}
	resp, err := p.http().Do(req)
	if err != nil {
		return reachOf(ctx, err, p.Proxy != nil)
	}
	defer func() { _ = resp.Body.Close() }()
	head := make([]byte, len(answerLine))
	n, _ := io.ReadFull(io.LimitReader(resp.Body, int64(len(head))), head)
	if resp.StatusCode == http.StatusOK && bytes.Equal(head[:n], answerLine) {
		return recovery.ReachAnswered
	}
	// Something else answered at the address (a proxy's error, another server): it proves
	// neither a live supervisor nor a lost node.
	return recovery.ReachUnknown
}

// reachOf reads a failed try: a deadline passed or no route is Silent, a refusal is Alive,
// the rest Unknown. Through a proxy only the deadline counts (Silent: the proxy, or the pod
// behind it, said nothing; LaggardFate counts it only when a peer's answer came through the
// same proxy): the proxy's own errors hide the pod's side.
func reachOf(ctx context.Context, err error, proxied bool) recovery.Reach {
	var ne net.Error
	timedOut := errors.Is(ctx.Err(), context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
	switch {
	case proxied && timedOut:
		return recovery.ReachSilent
	case proxied:
		return recovery.ReachUnknown
	case errors.Is(err, syscall.ECONNREFUSED):
		return recovery.ReachAlive
	case timedOut, errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return recovery.ReachSilent
	}
	return recovery.ReachUnknown
}
