//go:build e2e

// Package e2e tests the operator as users run it: the CRD applied with kubectl, a real
// scheduler placing pods on nodes that advertise amd.com/gpu, workers failing as they fail.
// It runs on two clusters (world_test.go): kwok with process-backed nodes and the operator
// binary as a process (hack/e2e.sh, make test-e2e), and kind with real kubelets and the
// operator from its chart (hack/kind/e2e.sh, make test-kind).
package e2e

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/test/nodeagent"
)

const (
	timeout  = 30 * time.Second
	interval = 200 * time.Millisecond
)

var (
	k8sClient                           client.Client
	clients                             *kubernetes.Clientset
	kubectlBin, operatorBin, kubeconfig string
	repoRoot                            = filepath.Join("..", "..")
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if w, err = selectWorld(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	kubeconfig, kubectlBin, operatorBin = os.Getenv("KUBECONFIG"), os.Getenv("ZAYA_E2E_KUBECTL"), os.Getenv("ZAYA_E2E_OPERATOR")
	if kubeconfig == "" || kubectlBin == "" || (operatorBin == "" && !w.kind()) {
		fmt.Fprintln(os.Stderr, "e2e needs KUBECONFIG, ZAYA_E2E_KUBECTL and (on kwok) ZAYA_E2E_OPERATOR: run it through make test-e2e or make test-kind")
		return 1
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubeconfig: %v\n", err)
		return 1
	}
	cfg.QPS, cfg.Burst = 100, 200
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(trainingv1alpha1.AddToScheme(scheme))
	if k8sClient, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		fmt.Fprintf(os.Stderr, "client: %v\n", err)
		return 1
	}
	if clients, err = kubernetes.NewForConfig(cfg); err != nil {
		fmt.Fprintf(os.Stderr, "clientset: %v\n", err)
		return 1
	}
	if w.kind() {
		// The chart installed the CRD and runs the operator (hack/kind/e2e.sh).
		return m.Run()
	}

	// Install as a user would, then run the operator binary for the whole suite.
	if out, err := kubectl("apply", "--server-side", "-f", filepath.Join(repoRoot, "config", "crd", "bases")); err != nil {
		fmt.Fprintf(os.Stderr, "installing the CRD: %v\n%s", err, out)
		return 1
	}
	if err := waitEstablished(); err != nil {
		fmt.Fprintf(os.Stderr, "waiting for the CRD: %v\n", err)
		return 1
	}
	// The operator reaches the process-backed pods through the agents' proxy.
	proxy := httptest.NewServer(nodeagent.PodNetworkProxy())
	defer proxy.Close()
	workerProxy = proxy.URL
	op, err := startOperator()
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting the operator: %v\n", err)
		return 1
	}
	suiteOperator = op
	defer func() { suiteOperator.stop() }()
	return m.Run()
}

// workerProxy is the agents' PodNetworkProxy, progressPollInterval how often the operator
// polls rank 0: often, so a straggler shows within seconds.
var (
	workerProxy          string
	progressPollInterval = time.Second
)

// suiteOperator reconciles for every test; a test that runs operators of its own pauses it.
var suiteOperator *operatorProcess

// pauseSuiteOperator stops the suite's operator until the test ends.
func pauseSuiteOperator(t *testing.T) {
	t.Helper()
	suiteOperator.stop()
	t.Cleanup(func() {
		op, err := startOperator()
		if err != nil {
			t.Fatalf("restarting the suite's operator: %v", err)
		}
		suiteOperator = op
	})
}

// waitEstablished polls the CRD until it is served (kubectl wait fails at once while the
// CRD has no conditions yet).
func waitEstablished() error {
	var out string
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(interval) {
		out, _ = kubectl("get", "crd", "zayatrainingjobs.training.zaya.dev",
			"-o", `jsonpath={.status.conditions[?(@.type=="Established")].status}`)
		if out == "True" {
			return nil
		}
	}
	return fmt.Errorf("not established within %v: %s", timeout, out)
}

// kubectl runs the pinned kubectl against the e2e cluster and returns its combined output.
func kubectl(args ...string) (string, error) {
	return kubectlIn("", args...)
}

// kubectlIn runs kubectl with stdin.
func kubectlIn(stdin string, args ...string) (string, error) {
	cmd := exec.Command(kubectlBin, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// operatorProcess is a running operator binary.
type operatorProcess struct {
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{}
	waitErr error // set before exited closes
	stopped sync.Once
	logFile *os.File
}

// stop interrupts the operator (it releases its lease) and waits for it.
func (o *operatorProcess) stop() { o.end(os.Interrupt) }

// kill is a crash: SIGKILL, no lease released.
func (o *operatorProcess) kill() { o.end(syscall.SIGKILL) }

func (o *operatorProcess) end(sig os.Signal) {
	o.stopped.Do(func() {
		_ = o.cmd.Process.Signal(sig)
		select {
		case <-o.exited:
		case <-time.After(10 * time.Second):
			_ = o.cmd.Process.Kill()
			<-o.exited
		}
		_ = o.logFile.Close()
	})
}

func (o *operatorProcess) log() string {
	b, _ := os.ReadFile(o.logPath)
	return string(b)
}

// startOperator runs the operator binary with extra flags and waits for its readiness probe.
func startOperator(extra ...string) (*operatorProcess, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	probe := l.Addr().String()
	_ = l.Close()

	logFile, err := os.CreateTemp("", fmt.Sprintf("zaya-e2e-operator-%d-*.log", os.Getpid()))
	if err != nil {
		return nil, err
	}
	level := "info"
	if l := os.Getenv("ZAYA_E2E_LOG_LEVEL"); l != "" {
		level = l // debug shows the goodput accounting (the "goodput" logger's V(1))
	}
	args := []string{"--kubeconfig", kubeconfig, "--metrics-bind-address=0",
		"--health-probe-bind-address=" + probe, "--zap-log-level=" + level,
		"--worker-proxy=" + workerProxy, "--progress-poll-interval=" + progressPollInterval.String(),
		// The node agent ignores images: its init container runs ZAYA_E2E_SUPERVISOR.
		"--supervisor-image=zaya-worker:dev"}
	if addr := os.Getenv("ZAYA_E2E_METRICS_ADDR"); addr != "" {
		// A Prometheus on this machine scrapes the operator (docs/observability.md's panels):
		// plain HTTP, and only one operator at a time can hold the address.
		args = append(args, "--metrics-bind-address="+addr, "--metrics-secure=false")
	}
	args = append(args, extra...)
	cmd := exec.Command(operatorBin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	o := &operatorProcess{cmd: cmd, logPath: logFile.Name(), exited: make(chan struct{}), logFile: logFile}
	go func() { o.waitErr = cmd.Wait(); close(o.exited) }()

	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case <-o.exited:
			return nil, fmt.Errorf("operator exited (%w):\n%s", o.waitErr, o.log())
		default:
		}
		if resp, err := http.Get("http://" + probe + "/readyz"); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				fmt.Fprintf(os.Stderr, "operator ready; log: %s\n", o.logPath)
				return o, nil
			}
		}
		time.Sleep(interval)
	}
	o.stop()
	return nil, fmt.Errorf("operator not ready within %v; log: %s", timeout, o.logPath)
}

// newNamespace makes a namespace of its own for one test.
// notLabel matches what a namespace name may not hold (a subtest's "/" or "=").
var notLabel = regexp.MustCompile(`[^a-z0-9-]+`)

func newNamespace(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("e2e-%s-%d", notLabel.ReplaceAllString(strings.ToLower(t.Name()), "-"), time.Now().UnixNano()%100000)
	if len(name) > 63 {
		name = name[len(name)-63:]
		name = "e" + strings.TrimLeft(name[1:], "-")
	}
	if out, err := kubectl("create", "namespace", name); err != nil {
		t.Fatalf("creating namespace: %v\n%s", err, out)
	}
	// Waiting keeps tests apart: a namespace's pods hold fake GPUs until they are gone.
	t.Cleanup(func() { _, _ = kubectl("delete", "namespace", name, "--timeout=90s") })
	return name
}
