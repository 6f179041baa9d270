package supervisorprobe

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/zaya-operator/zaya-operator/api/contract"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

func declared(mut func(*corev1.Pod)) *corev1.Pod {
	pod := &corev1.Pod{
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Ports: []corev1.ContainerPort{
			{Name: contract.SupervisorPortName, ContainerPort: contract.SupervisorPort, Protocol: corev1.ProtocolTCP},
		}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.1.7", HostIP: "172.18.0.3"},
	}
	if mut != nil {
		mut(pod)
	}
	return pod
}

func TestAddr(t *testing.T) {
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"declared, running", declared(nil), "10.244.1.7:29511"},
		{"nil", nil, ""},
		{"not running", declared(func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending }), ""},
		{"being deleted", declared(func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: time.Now()} }), ""},
		{"host network", declared(func(p *corev1.Pod) { p.Spec.HostNetwork = true }), ""},
		{"pod IP is the node's", declared(func(p *corev1.Pod) { p.Status.PodIP = p.Status.HostIP }), ""},
		{"no pod IP", declared(func(p *corev1.Pod) { p.Status.PodIP = "" }), ""},
		{"port not declared: no injected supervisor", declared(func(p *corev1.Pod) { p.Spec.Containers[0].Ports = nil }), ""},
		{"the name on another number", declared(func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].ContainerPort = 8080 }), ""},
		{"UDP", declared(func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].Protocol = corev1.ProtocolUDP }), ""},
		{"declared on a sidecar, not the worker", declared(func(p *corev1.Pod) {
			p.Spec.Containers = append([]corev1.Container{{Name: "worker"}}, corev1.Container{Name: "sidecar", Ports: p.Spec.Containers[0].Ports})
		}), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Addr(tc.pod); got != tc.want {
				t.Errorf("Addr = %q, want %q", got, tc.want)
			}
		})
	}
}

// hostPort is srv's address as host:port.
func hostPort(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

func proxyURL(t *testing.T, srv *httptest.Server) *url.URL {
	t.Helper()
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestAsk(t *testing.T) {
	fast := &Prober{Timeout: 200 * time.Millisecond}
	answers := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != contract.SupervisorPath {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, contract.SupervisorAnswer)
	}))
	defer answers.Close()
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	}))
	defer other.Close()
	// A frozen process: the kernel takes the connection, nobody reads it.
	frozen, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = frozen.Close() }()
	// A port nobody listens on: the kernel refuses.
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := closed.Addr().String()
	_ = closed.Close()

	// A forwarding proxy, as --worker-proxy names one.
	proxy := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.Out.URL = r.In.URL }})
	defer proxy.Close()

	for _, tc := range []struct {
		name string
		p    *Prober
		addr string
		want recovery.Reach
	}{
		{"the supervisor's line", fast, hostPort(t, answers), recovery.ReachAnswered},
		{"another server's answer proves nothing", fast, hostPort(t, other), recovery.ReachUnknown},
		{"taken, never answered", fast, frozen.Addr().String(), recovery.ReachSilent},
		{"refused: a live kernel", fast, refused, recovery.ReachAlive},
		{"through a proxy, a failure hides the pod's side", &Prober{Proxy: &url.URL{Scheme: "http", Host: refused}, Timeout: 200 * time.Millisecond},
			hostPort(t, answers), recovery.ReachUnknown},
		{"through a proxy, the answer", &Prober{Proxy: proxyURL(t, proxy), Timeout: 500 * time.Millisecond}, hostPort(t, answers), recovery.ReachAnswered},
		{"through a proxy, a pod that never answers", &Prober{Proxy: proxyURL(t, proxy), Timeout: 200 * time.Millisecond},
			frozen.Addr().String(), recovery.ReachSilent},
		{"through a proxy, a refusal is the proxy's error", &Prober{Proxy: proxyURL(t, proxy), Timeout: 500 * time.Millisecond}, refused, recovery.ReachUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.ask(context.Background(), tc.addr); got != tc.want {
				t.Errorf("ask(%s) = %d, want %d", tc.addr, got, tc.want)
			}
		})
	}
}

// Pods that cannot be asked each get Unknown, in their order, without a request.
func TestAskOfPodsThatCannotBeAsked(t *testing.T) {
	p := &Prober{}
	got := p.Ask(context.Background(), nil, declared(func(p *corev1.Pod) { p.Spec.Containers[0].Ports = nil }))
	if len(got) != 2 || got[0] != recovery.ReachUnknown || got[1] != recovery.ReachUnknown {
		t.Errorf("Ask of unaskable pods = %v", got)
	}
}
