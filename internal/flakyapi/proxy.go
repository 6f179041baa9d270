// Package flakyapi is a reverse proxy in front of a kube-apiserver that misbehaves on purpose:
// it throttles (429), fails (5xx), drops the responses of writes it has forwarded (the write
// happened, the client hears a timeout), answers watches with 410 Gone and cuts every watch
// stream after a while. Tests point a client at it to prove the operator survives an
// unreliable control plane.
package flakyapi

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// Faults says how often each misbehaviour happens; rates are probabilities per request, and
// every fault with a rate above 0 happens on the first request it can apply to.
type Faults struct {
	Throttle     float64       // 429 with Retry-After, nothing forwarded
	ServerError  float64       // 500 or 503, nothing forwarded
	LostResponse float64       // writes only: forwarded, then answered with 504 Timeout
	Gone         float64       // watches only: 410 Expired, the client must relist
	Latency      time.Duration // up to this much delay before forwarding
	WatchCut     time.Duration // every watch stream ends after between half this and this long (0: never)
}

// Kind names a fault, for Counts.
type Kind string

// The proxy's fault kinds, and Forwarded for requests it let through untouched.
const (
	Throttled    Kind = "throttled"
	ServerErrors Kind = "server-error"
	LostReplies  Kind = "lost-response"
	GoneWatches  Kind = "gone"
	CutWatches   Kind = "watch-cut"
	Forwarded    Kind = "forwarded"
)

// Proxy is a TLS server forwarding to an apiserver with the credentials of the upstream
// config, so clients of Config need none.
type Proxy struct {
	srv *httptest.Server
	rp  *httputil.ReverseProxy

	mu     sync.Mutex
	rnd    *rand.Rand
	faults Faults
	counts map[Kind]int
}

// Start runs a proxy to upstream's apiserver; seed makes the fault sequence reproducible for
// a sequential client. Close it when done.
func Start(upstream *rest.Config, faults Faults, seed uint64) (*Proxy, error) {
	target, err := url.Parse(upstream.Host)
	if err != nil {
		return nil, fmt.Errorf("upstream host: %w", err)
	}
	if target.Scheme == "" {
		target.Scheme = "https"
	}
	transport, err := rest.TransportFor(upstream)
	if err != nil {
		return nil, fmt.Errorf("upstream transport: %w", err)
	}
	p := &Proxy{
		rnd:    rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		faults: faults,
		counts: map[Kind]int{},
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Host = target.Host
		},
		Transport:     transport,
		FlushInterval: -1,                         // stream watch events as they come
		ErrorLog:      log.New(io.Discard, "", 0), // cut streams are the point, not news
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			// A cut watch or a client that gave up: nothing useful to answer.
			if r.Context().Err() == nil {
				writeStatus(w, http.StatusBadGateway, metav1.StatusReasonServiceUnavailable, "proxy: "+err.Error(), 0)
			}
		},
	}
	p.srv = httptest.NewUnstartedServer(p)
	p.srv.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	p.srv.StartTLS()
	return p, nil
}

// Close stops the proxy and ends every stream through it.
func (p *Proxy) Close() {
	p.srv.CloseClientConnections()
	p.srv.Close()
}

// Config is a client config that talks to the apiserver through the proxy.
func (p *Proxy) Config() *rest.Config {
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw})
	return &rest.Config{
		Host:            p.srv.URL,
		TLSClientConfig: rest.TLSClientConfig{CAData: ca},
		QPS:             -1, // no client-side throttling: the proxy is the one that throttles
	}
}

// SetFaults changes the misbehaviour from the next request on (Faults{} makes it a plain proxy).
func (p *Proxy) SetFaults(f Faults) {
	p.mu.Lock()
	p.faults = f
	p.mu.Unlock()
}

// Counts is how many requests met each fault so far.
func (p *Proxy) Counts() map[Kind]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[Kind]int, len(p.counts))
	for k, v := range p.counts {
		out[k] = v
	}
	return out
}

// decision is what happens to one request.
type decision struct {
	kind    Kind
	latency time.Duration
	cut     time.Duration
	code    int
}

func (p *Proxy) decide(r *http.Request) decision {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.faults
	d := decision{kind: Forwarded}
	if f.Latency > 0 {
		d.latency = time.Duration(p.rnd.Int64N(int64(f.Latency)))
	}
	x := p.rnd.Float64()
	// Every enabled fault happens at least once, on the first request it can apply to, so a
	// short test meets them all.
	first := func(k Kind, rate float64) bool { return rate > 0 && p.counts[k] == 0 }
	switch {
	case isWatch(r) && first(GoneWatches, f.Gone):
		x = 0
	case !isWatch(r) && first(Throttled, f.Throttle):
		x = 0
	case !isWatch(r) && first(ServerErrors, f.ServerError):
		x = f.Throttle
	case isWrite(r) && first(LostReplies, f.LostResponse):
		x = f.Throttle + f.ServerError
	}
	switch {
	case isWatch(r):
		if x < f.Gone {
			d.kind = GoneWatches
		} else if f.WatchCut > 0 {
			// Never under half of WatchCut: client-go takes a watch that ends within a second
			// with no events for a broken server and backs off up to a minute, growing while it
			// keeps happening. Real servers end watches after minutes; cuts that short would
			// test client-go's backoff, not the operator.
			d.kind = CutWatches
			d.cut = max(f.WatchCut/2+time.Duration(p.rnd.Int64N(int64(f.WatchCut/2)+1)), time.Millisecond)
		}
	case x < f.Throttle:
		d.kind = Throttled
	case x < f.Throttle+f.ServerError:
		d.kind = ServerErrors
		d.code = []int{http.StatusInternalServerError, http.StatusServiceUnavailable}[p.rnd.IntN(2)]
	case isWrite(r) && x < f.Throttle+f.ServerError+f.LostResponse:
		d.kind = LostReplies
	}
	p.counts[d.kind]++
	return d
}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d := p.decide(r)
	if d.latency > 0 {
		select {
		case <-time.After(d.latency):
		case <-r.Context().Done():
			return
		}
	}
	switch d.kind {
	case Throttled:
		writeStatus(w, http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests, "proxy: too many requests, try again", 1)
	case ServerErrors:
		reason := metav1.StatusReasonInternalError
		if d.code == http.StatusServiceUnavailable {
			reason = metav1.StatusReasonServiceUnavailable
		}
		writeStatus(w, d.code, reason, "proxy: injected server error", 0)
	case GoneWatches:
		writeStatus(w, http.StatusGone, metav1.StatusReasonExpired, "proxy: too old resource version", 0)
	case LostReplies:
		p.rp.ServeHTTP(httptest.NewRecorder(), r) // the write happens...
		writeStatus(w, http.StatusGatewayTimeout, metav1.StatusReasonTimeout,
			"proxy: the server was unable to return a response in the time allotted", 0) // ...the client never learns
	case CutWatches:
		ctx, cancel := context.WithTimeout(r.Context(), d.cut)
		defer cancel()
		p.rp.ServeHTTP(w, r.WithContext(ctx))
	default:
		p.rp.ServeHTTP(w, r)
	}
}

func isWatch(r *http.Request) bool {
	v := r.URL.Query().Get("watch")
	return v == "true" || v == "1"
}

func isWrite(r *http.Request) bool {
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

// writeStatus answers like the apiserver does, so clients decode a proper StatusError.
func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string, retryAfter int) {
	st := metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Message: msg, Reason: reason, Code: int32(code),
	}
	if retryAfter > 0 {
		st.Details = &metav1.StatusDetails{RetryAfterSeconds: int32(retryAfter)}
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(&st)
}
