package supervisor_test

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/zaya-operator/zaya-operator/api/contract"
)

// answerAt GETs the supervisor's answer at addr once.
func answerAt(addr string) (string, error) {
	client := &http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get("http://" + addr + contract.SupervisorPath)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	return resp.Status + " " + string(body), err
}

// The supervisor answers the operator while its worker runs, whatever the worker does, and
// stops answering when it ends: a stopped worker's pod refuses.
func TestTheSupervisorAnswersWhileItRuns(t *testing.T) {
	addr := freeAddr(t)
	r := supervise(t, []string{"--no-gang", "--progress-listen=", "--answer-listen=" + addr}, nil,
		"sh", "-c", `touch started; while [ ! -e done ]; do sleep 0.02; done`)
	waitFor(t, filepath.Join(r.cmd.Dir, "started"))
	var got string
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if got, err = answerAt(addr); err == nil {
			break
		}
	}
	if want := "200 OK " + contract.SupervisorAnswer; err != nil || got != want {
		t.Fatalf("answer = %q, %v; want %q", got, err, want)
	}
	// Nothing but the fixed line, and nothing but GET.
	if resp, err := http.Post("http://"+addr+contract.SupervisorPath, "text/plain", nil); err != nil || resp.StatusCode == http.StatusOK {
		t.Errorf("POST answered %v, %v; want refused with a status", resp, err)
	} else {
		_ = resp.Body.Close()
	}
	if err := os.WriteFile(filepath.Join(r.cmd.Dir, "done"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _ := r.wait(t); code != 0 {
		t.Fatalf("exit %d, want 0", code)
	}
	if got, err := answerAt(addr); err == nil {
		t.Errorf("answered %q after the supervisor ended", got)
	}
}
