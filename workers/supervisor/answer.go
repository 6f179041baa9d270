package supervisor

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"

	"github.com/zaya-operator/zaya-operator/api/contract"
)

// The supervisor answers the operator (contract.SupervisorPath) for as long as it runs, so
// that a rank its peers stopped over can be told from a lost node by a second look from
// another place (docs/design/fast-node-loss.md): a process that answers runs on a live
// kernel and a live network, whatever its pod's status still says. It serves a fixed line,
// reads nothing of the request's body, and holds few connections: anyone in the cluster
// network may ask.

// answerConns bounds the connections served at once; more wait in the kernel's backlog.
const answerConns = 8

// serveAnswer answers at listen until the returned stop is called; an address it cannot
// take is logged and nothing is served (the operator then waits for the node's Lease).
func serveAnswer(listen string, log io.Writer) (stop func()) {
	if listen == "" {
		return func() {}
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		fmt.Fprintf(log, "zaya-supervisor: not answering the operator: %v\n", err)
		return func() {}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+contract.SupervisorPath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, contract.SupervisorAnswer)
	})
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: time.Second,
		ReadTimeout:       2 * time.Second,
		WriteTimeout:      2 * time.Second,
		IdleTimeout:       10 * time.Second,
		MaxHeaderBytes:    4 << 10,
	}
	go func() { _ = srv.Serve(netutil.LimitListener(ln, answerConns)) }()
	return func() { _ = srv.Close() }
}
