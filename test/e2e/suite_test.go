//go:build e2e

// Package e2e tests the operator as users run it: the CRD applied with kubectl, the operator
// binary as a process, and a real scheduler placing pods on nodes that advertise amd.com/gpu.
// hack/e2e.sh provides the cluster (KUBECONFIG), kubectl and the operator binary.
package e2e

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

const (
	timeout  = 30 * time.Second
	interval = 200 * time.Millisecond
)

var (
	k8sClient                           client.Client
	kubectlBin, operatorBin, kubeconfig string
	repoRoot                            = filepath.Join("..", "..")
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	kubeconfig, kubectlBin, operatorBin = os.Getenv("KUBECONFIG"), os.Getenv("ZAYA_E2E_KUBECTL"), os.Getenv("ZAYA_E2E_OPERATOR")
	if kubeconfig == "" || kubectlBin == "" || operatorBin == "" {
		fmt.Fprintln(os.Stderr, "e2e needs KUBECONFIG, ZAYA_E2E_KUBECTL and ZAYA_E2E_OPERATOR: run it through make test-e2e")
		return 1
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubeconfig: %v\n", err)
		return 1
	}
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(trainingv1alpha1.AddToScheme(scheme))
	if k8sClient, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		fmt.Fprintf(os.Stderr, "client: %v\n", err)
		return 1
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
	stop, err := startOperator()
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting the operator: %v\n", err)
		return 1
	}
	defer stop()
	return m.Run()
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

// startOperator runs the operator binary and waits for its readiness probe.
func startOperator() (func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	probe := l.Addr().String()
	_ = l.Close()

	logPath := filepath.Join(os.TempDir(), fmt.Sprintf("zaya-e2e-operator-%d.log", os.Getpid()))
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(operatorBin, "--kubeconfig", kubeconfig, "--metrics-bind-address=0",
		"--health-probe-bind-address="+probe, "--zap-log-level=info")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	var waitErr error // set before exited closes
	go func() { waitErr = cmd.Wait(); close(exited) }()
	stop := func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = logFile.Close()
	}

	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			log, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("operator exited (%w):\n%s", waitErr, log)
		default:
		}
		if resp, err := http.Get("http://" + probe + "/readyz"); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				fmt.Fprintf(os.Stderr, "operator ready; log: %s\n", logPath)
				return stop, nil
			}
		}
		time.Sleep(interval)
	}
	stop()
	return nil, fmt.Errorf("operator not ready within %v; log: %s", timeout, logPath)
}

// newNamespace makes a namespace of its own for one test.
func newNamespace(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("e2e-%s-%d", strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")), time.Now().UnixNano()%100000)
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
