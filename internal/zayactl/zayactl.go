// Package zayactl is `kubectl zaya`: what a platform team asks of a training job, read from
// the job's status and pods. Each command builds a report as a pure function of the objects it
// read (statusOf, whyOf, timelineOf) and prints it as text, JSON or YAML; the clients are made
// from kubectl's own flags (--kubeconfig, --context, -n, ...).
package zayactl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// Main runs kubectl zaya with args and returns its exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := root(stdout, stderr)
	cmd.SetArgs(args)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	if err := cmd.ExecuteContext(ctx); err != nil {
		_, _ = fmt.Fprintln(stderr, "error:", err)
		return 1
	}
	return 0
}

// session is what every command needs: the cluster's clients, the namespace and the output.
type session struct {
	loading   *clientcmd.ClientConfigLoadingRules
	overrides clientcmd.ConfigOverrides
	output    string
	out, errs io.Writer
}

func root(out, errs io.Writer) *cobra.Command {
	s := &session{loading: clientcmd.NewDefaultClientConfigLoadingRules(), out: out, errs: errs}
	cmd := &cobra.Command{
		Use:           "kubectl-zaya",
		Short:         "Look at ZayaTrainingJobs: their gang, why they restarted, their goodput, their logs",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	flags := cmd.PersistentFlags()
	flags.StringVar(&s.loading.ExplicitPath, "kubeconfig", "", "path to the kubeconfig file")
	clientcmd.BindOverrideFlags(&s.overrides, flags, clientcmd.RecommendedConfigOverrideFlags(""))
	flags.StringVarP(&s.output, "output", "o", "", "output format: text (default), json or yaml")
	cmd.AddCommand(s.statusCmd(), s.whyCmd(), s.goodputCmd(), s.logsCmd(), s.preflightCmd(), s.versionCmd())
	return cmd
}

func (s *session) config() clientcmd.ClientConfig {
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(s.loading, &s.overrides)
}

func (s *session) rest() (*rest.Config, error) {
	cfg, err := s.config().ClientConfig()
	if err != nil {
		return nil, err
	}
	cfg.UserAgent = "kubectl-zaya"
	return cfg, nil
}

func (s *session) namespace() (string, error) {
	ns, _, err := s.config().Namespace()
	return ns, err
}

// reader is a client of the objects the reports read (and of preflight's dry-run pod).
func (s *session) reader() (client.Client, error) {
	cfg, err := s.rest()
	if err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := trainingv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{Scheme: scheme})
}

// job reads the job named name and its pods.
func (s *session) job(ctx context.Context, name string) (*trainingv1alpha1.ZayaTrainingJob, []corev1.Pod, error) {
	c, err := s.reader()
	if err != nil {
		return nil, nil, err
	}
	ns, err := s.namespace()
	if err != nil {
		return nil, nil, err
	}
	job := &trainingv1alpha1.ZayaTrainingJob{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, job); err != nil {
		return nil, nil, err
	}
	pods := &corev1.PodList{}
	if err := c.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{trainingv1alpha1.JobNameLabel: name}); err != nil {
		return nil, nil, err
	}
	return job, pods.Items, nil
}

// print writes report as JSON or YAML when asked, else as text.
func (s *session) print(report any, text func(io.Writer) error) error {
	switch s.output {
	case "", "text", "wide":
		return text(s.out)
	case "json":
		b, err := json.MarshalIndent(report, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(s.out, string(b))
		return err
	case "yaml":
		b, err := yaml.Marshal(report)
		if err != nil {
			return err
		}
		_, err = s.out.Write(b)
		return err
	}
	return fmt.Errorf("--output %q: want text, json or yaml", s.output)
}

// terminal reports whether w is a terminal (colour only there).
func terminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
