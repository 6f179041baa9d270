package nodeagent

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The proxy reaches a pod's process by its reported address, answers 502 for a pod that
// serves nothing there, and forwards nothing outside the pod network.
func TestThePodNetworkProxy(t *testing.T) {
	l, err := net.Listen("tcp", "127.1.0.9:0")
	if err != nil {
		t.Skipf("127.1.0.9 is not local here: %v", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("step=5\n")) })}
	go func() { _ = srv.Serve(l) }()
	defer func() { _ = srv.Close() }()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	closed, _ := net.Listen("tcp", "127.1.0.9:0")
	_, closedPort, _ := net.SplitHostPort(closed.Addr().String())
	_ = closed.Close()

	proxy := PodNetworkProxy()
	for _, tc := range []struct {
		url  string
		code int
		body string
	}{
		{"http://10.244.0.9:" + port + "/progress", http.StatusOK, "step=5"},
		{"http://10.244.0.9:" + closedPort + "/progress", http.StatusBadGateway, "refused"},
		{"http://127.0.0.1:" + port + "/progress", http.StatusForbidden, "not a pod address"},
	} {
		rec := httptest.NewRecorder()
		proxy.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.url, nil))
		if rec.Code != tc.code || !strings.Contains(rec.Body.String(), tc.body) {
			t.Errorf("%s: %d %q, want %d with %q", tc.url, rec.Code, rec.Body.String(), tc.code, tc.body)
		}
	}
}
