// Package integration tests the CRD and the operator against a real kube-apiserver and etcd
// (envtest, binaries built by hack/tools.sh). There is no scheduler or kubelet here.
package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/kueue"
)

// Shared waits, as kueue's integration tests use them.
const (
	timeout  = 10 * time.Second
	interval = 100 * time.Millisecond
)

var (
	cfg       *rest.Config
	k8sClient client.Client
	scheme    = runtime.NewScheme()
	repoRoot  = filepath.Join("..", "..")
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(trainingv1alpha1.AddToScheme(scheme))
	utilruntime.Must(kueue.AddToScheme(scheme))
	logf.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(true), zap.Level(zapLevel())))

	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		assets, _ := filepath.Abs(filepath.Join(repoRoot, "bin", "envtest"))
		_ = os.Setenv("KUBEBUILDER_ASSETS", assets)
	}
	env := &envtest.Environment{
		CRDDirectoryPaths: []string{filepath.Join(repoRoot, "config", "crd", "bases"),
			filepath.Join(repoRoot, "test", "integration", "testdata", "kueue")},
		ErrorIfCRDPathMissing: true,
	}
	var err error
	if cfg, err = env.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "starting envtest (run hack/tools.sh envtest first): %v\n", err)
		_ = env.Stop() // a half-started control plane would outlive the test
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping envtest: %v\n", err)
		}
	}()
	if k8sClient, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		fmt.Fprintf(os.Stderr, "client: %v\n", err)
		return 1
	}
	// The operator's own namespace, where it keeps its pod-mark key.
	opNS := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: podMarkSecret.Namespace}}
	if err := k8sClient.Create(context.Background(), opNS); err != nil {
		fmt.Fprintf(os.Stderr, "namespace %s: %v\n", opNS.Name, err)
		return 1
	}
	return m.Run()
}

// zapLevel is quiet unless ZAYA_TEST_VERBOSE is set.
func zapLevel() zapLevelEnabler {
	if os.Getenv("ZAYA_TEST_VERBOSE") != "" {
		return debugLevel
	}
	return errorLevel
}

// newNamespace makes a namespace of its own for one test.
func newNamespace(t *testing.T) string {
	t.Helper()
	return newNamespaceLabelled(t, nil)
}

// newNamespaceEnforcing is a fresh namespace whose Pod Security admission enforces level.
func newNamespaceEnforcing(t *testing.T, level string) string {
	t.Helper()
	return newNamespaceLabelled(t, map[string]string{"pod-security.kubernetes.io/enforce": level})
}

func newNamespaceLabelled(t *testing.T, labels map[string]string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "ztj-", Labels: labels}}
	if err := k8sClient.Create(context.Background(), ns); err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	t.Cleanup(func() {
		// envtest runs no namespace controller: without this the jobs would live on, and every
		// later test's operator would reconcile them (and fail to create in a terminating
		// namespace) next to the job it is testing.
		_ = k8sClient.DeleteAllOf(context.Background(), &trainingv1alpha1.ZayaTrainingJob{}, client.InNamespace(ns.Name))
		_ = k8sClient.Delete(context.Background(), ns)
	})
	return ns.Name
}
