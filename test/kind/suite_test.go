//go:build e2e

// Package kind tests recovery on kubelets we did not write: a kind cluster whose nodes are
// Docker containers running the real kubelet and containerd, fake AMD devices served by
// test/fakedeviceplugin through the kubelet's device-plugin API, the operator installed by its
// Helm chart from the image built here, and the reference worker running from its image.
// Faults are what a real cluster sees: a worker process killed or stopped inside its node, a
// node stopped (docker stop), frozen (docker pause) or cut off the network, a GPU the device
// plugin reports unhealthy. hack/kind/e2e.sh (make test-kind) provides the cluster.
package kind

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

var (
	k8sClient client.Client
	clientset *kubernetes.Clientset
	// sharedDir is a host folder that every kind node mounts at the same path: checkpoints
	// written by a rank on one node are read by its replacement on another, and by the test.
	sharedDir  string
	kubectlBin string
	workerImg  string
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	kubeconfig := os.Getenv("KUBECONFIG")
	sharedDir, kubectlBin = os.Getenv("ZAYA_KIND_SHARED_DIR"), os.Getenv("ZAYA_E2E_KUBECTL")
	workerImg = os.Getenv("ZAYA_KIND_WORKER_IMAGE")
	if kubeconfig == "" || sharedDir == "" || kubectlBin == "" || workerImg == "" {
		fmt.Fprintln(os.Stderr, "kind e2e needs KUBECONFIG, ZAYA_KIND_SHARED_DIR, ZAYA_E2E_KUBECTL and ZAYA_KIND_WORKER_IMAGE: run it through make test-kind")
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
	if clientset, err = kubernetes.NewForConfig(cfg); err != nil {
		fmt.Fprintf(os.Stderr, "clientset: %v\n", err)
		return 1
	}
	return m.Run()
}

// kubectl runs the pinned kubectl against the kind cluster.
func kubectl(args ...string) (string, error) {
	return command(kubectlBin, args...)
}

// docker runs the Docker CLI: what a test does to a node (a container) from outside.
func docker(args ...string) (string, error) {
	return command("docker", args...)
}

func command(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), err
}

var notLabel = regexp.MustCompile(`[^a-z0-9-]+`)

// newNamespace makes a namespace for one test, deleted (and waited for, so its pods give
// their devices back) when the test ends.
func newNamespace(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("kind-%s-%d", notLabel.ReplaceAllString(strings.ToLower(t.Name()), "-"), time.Now().UnixNano()%100000)
	if len(name) > 63 {
		name = "k" + strings.TrimLeft(name[len(name)-62:], "-")
	}
	if out, err := kubectl("create", "namespace", name); err != nil {
		t.Fatalf("creating namespace: %v\n%s", err, out)
	}
	t.Cleanup(func() { _, _ = kubectl("delete", "namespace", name, "--timeout=120s") })
	return name
}
