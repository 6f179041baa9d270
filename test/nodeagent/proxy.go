package nodeagent

import (
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
)

// PodNetworkProxy is an HTTP proxy into the agents' pod network: a request for a pod's
// address (10.244.x.y, as pods report it) reaches its process (127.1.x.y). The operator,
// outside that network as on a cluster it runs beside, reaches workers through it
// (--worker-proxy). It forwards nothing else.
func PodNetworkProxy() http.Handler {
	rp := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		host, port, _ := net.SplitHostPort(r.In.URL.Host)
		r.Out.URL.Scheme, r.Out.URL.Host, r.Out.Host = "http", net.JoinHostPort(processIP(host), port), ""
	}, ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
		// As the default handler answers, without its log line: a pod that serves no progress
		// refuses the operator's poll every second, which said "http: proxy error" as often.
		http.Error(w, err.Error(), http.StatusBadGateway)
	}}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.URL.Host)
		if err != nil || !strings.HasPrefix(host, "10.244.") || net.ParseIP(host) == nil {
			http.Error(w, "not a pod address", http.StatusForbidden)
			return
		}
		rp.ServeHTTP(w, r)
	})
}
