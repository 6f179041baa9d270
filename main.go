// Command zaya-operator runs the ZayaTrainingJob controller.
package main

import (
	"crypto/tls"
	"flag"
	"net/url"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers"
	"github.com/zaya-operator/zaya-operator/controllers/admission/kueuegate"
	"github.com/zaya-operator/zaya-operator/controllers/liveprogress"
	"github.com/zaya-operator/zaya-operator/controllers/nodehealth"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
	"github.com/zaya-operator/zaya-operator/controllers/supervisorprobe"
	"github.com/zaya-operator/zaya-operator/internal/kueue"
)

func main() {
	var (
		metricsAddr, probeAddr, pprofAddr, namespaces, leaderElectionNamespace, leaderElectionID, podMarkSecret, spareImage, supervisorImage, failurePatterns string
		leaderElect, metricsSecure, kueueWorkloads                                                                                                            bool
		metricsCertDir                                                                                                                                        string
		concurrency, burst                                                                                                                                    int
		qps                                                                                                                                                   float64
		progressInterval                                                                                                                                      time.Duration
		workerProxy                                                                                                                                           string
		hardwareTaint                                                                                                                                         nodehealth.HardwareTaintPolicy
		quarantineTaintMax                                                                                                                                    time.Duration
		sparePriorityClass                                                                                                                                    string
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8443", "address the Prometheus metrics endpoint binds to; 0 disables it")
	flag.BoolVar(&metricsSecure, "metrics-secure", true, "serve metrics over HTTPS, only to callers the API server authenticates (a bearer token) and authorizes (get on the /metrics non-resource URL); false: plain HTTP to anyone who reaches the port")
	flag.StringVar(&metricsCertDir, "metrics-cert-dir", "", "directory holding tls.crt and tls.key for the metrics endpoint (a cert-manager Secret, say); empty: a self-signed certificate made at start")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "address the /healthz and /readyz probes bind to")
	flag.StringVar(&pprofAddr, "pprof-bind-address", "0", "address net/http/pprof binds to, for profiling; 0 disables it (the default: never expose it beyond the pod)")
	flag.BoolVar(&leaderElect, "leader-elect", false, "elect a leader so only one replica reconciles")
	flag.StringVar(&leaderElectionID, "leader-election-id", "zaya-operator", "name of the leader-election Lease; operators installed side by side (one per team) need their own")
	flag.StringVar(&leaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader-election Lease (default: the operator's own)")
	flag.StringVar(&podMarkSecret, "pod-mark-secret", "", "namespace/name of the Secret (created on first use) keeping the key the operator marks its pods with, so a pod forged with a job's labels and owner is never a rank; empty keeps the key in memory, trusting the pods that existed before the process started")
	flag.StringVar(&sparePriorityClass, "spare-priority-class", "", "priority class of the warm spare pods (faultTolerance.spares); empty: none (the cluster's default). Never the template's: an idle spare must not preempt others; name a low class whose preemptionPolicy is Never")
	flag.StringVar(&supervisorImage, "supervisor-image", "", "image holding zaya-supervisor at "+trainingv1alpha1.SupervisorImagePath+" (the worker image does), copied by an init container in front of each worker command (faultTolerance.supervisor Inject); empty: commands run as written")
	flag.StringVar(&spareImage, "spare-image", recovery.DefaultSpareImage, "image of the warm spare pods (faultTolerance.spares): it only holds a node, like a pause container")
	flag.StringVar(&failurePatterns, "failure-patterns", "", "namespace/name of a ConfigMap whose "+controllers.FailurePatternsKey+" adds failure patterns to the shipped ones (read every 30s; a bad version is refused with an event on it); empty: the shipped ones alone")
	flag.DurationVar(&progressInterval, "progress-poll-interval", 10*time.Second, "how often rank 0 of each running job is asked for its live progress (when it trains again, stragglers); 0 disables it")
	flag.StringVar(&workerProxy, "worker-proxy", "", "HTTP proxy URL through which the operator reaches worker pods' progress endpoints, where it runs outside the pod network; empty: directly")
	flag.IntVar(&hardwareTaint.Namespaces, "hardware-taint-namespaces", 0, "taint a node training.zaya.dev/hardware-suspect:NoSchedule for every workload once jobs of this many namespaces rooted hardware failures (GPU, NIC) on it within --hardware-taint-window; 0 disables it")
	flag.DurationVar(&hardwareTaint.Window, "hardware-taint-window", 24*time.Hour, "how far back hardware failures count towards --hardware-taint-namespaces")
	flag.DurationVar(&hardwareTaint.Expiry, "hardware-taint-expiry", 24*time.Hour, "how long a hardware-suspect taint stays before the operator removes it")
	flag.DurationVar(&quarantineTaintMax, "quarantine-taint-max", 24*time.Hour, "the longest a job's quarantine taint (quarantine.nodeTaint: NoSchedule, on a lost node or an unhealthy device) stays on a node before the operator removes it, whatever the job's expireAfter")
	flag.BoolVar(&kueueWorkloads, "kueue-workloads", false, "run jobs labelled kueue.x-k8s.io/queue-name as Kueue workloads (Kueue's external-framework integration: the operator creates each job's Workload and starts the job on admission); needs Kueue v0.16+ installed with ZayaTrainingJob.v1alpha1.training.zaya.dev in integrations.externalFrameworks (docs/kueue.md)")
	flag.StringVar(&namespaces, "namespaces", "", "comma-separated namespaces to watch (default: all)")
	flag.IntVar(&concurrency, "concurrency", 8, "ZayaTrainingJobs reconciled in parallel")
	flag.Float64Var(&qps, "kube-api-qps", 500, "steady client requests per second to the API server")
	flag.IntVar(&burst, "kube-api-burst", 1000, "client request burst to the API server")
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	setupLog := ctrl.Log.WithName("setup")

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(trainingv1alpha1.AddToScheme(scheme))
	utilruntime.Must(kueue.AddToScheme(scheme))

	cfg := ctrl.GetConfigOrDie()
	cfg.QPS, cfg.Burst = float32(qps), burst

	cacheOpts := controllers.CacheOptions()
	if kueueWorkloads {
		cacheOpts.ByObject[&kueue.Workload{}] = cache.ByObject{Transform: kueue.SlimWorkload}
	}
	if namespaces != "" {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{}
		for ns := range strings.SplitSeq(namespaces, ",") {
			if ns = strings.TrimSpace(ns); ns != "" {
				cacheOpts.DefaultNamespaces[ns] = cache.Config{}
			}
		}
	}

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Cache:                   cacheOpts,
		Client:                  controllers.ClientOptions(),
		Metrics:                 metricsOptions(metricsAddr, metricsSecure, metricsCertDir),
		HealthProbeBindAddress:  probeAddr,
		PprofBindAddress:        pprofAddr,
		LeaderElection:          leaderElect,
		LeaderElectionID:        leaderElectionID,
		LeaderElectionNamespace: leaderElectionNamespace,
		// The process exits right after it loses the lease, so it can hand over at once.
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		setupLog.Error(err, "unable to create manager")
		os.Exit(1)
	}

	var markSecret types.NamespacedName
	if podMarkSecret != "" {
		if markSecret, err = controllers.ParseNamespacedName(podMarkSecret); err != nil {
			setupLog.Error(err, "bad --pod-mark-secret")
			os.Exit(1)
		}
	}
	reconciler := &controllers.ZayaTrainingJobReconciler{
		Client:             mgr.GetClient(),
		APIReader:          mgr.GetAPIReader(),
		Recorder:           mgr.GetEventRecorder("zaya-operator"),
		Clock:              clock.RealClock{},
		PodMarkSecret:      markSecret,
		SpareImage:         spareImage,
		SupervisorImage:    supervisorImage,
		SparePriorityClass: sparePriorityClass,
		HardwareTaint:      hardwareTaint,
		QuarantineTaintMax: quarantineTaintMax,
		// Kueue's pod groups are always served; its Workloads with --kueue-workloads.
		Admission: kueuegate.New(mgr.GetClient(), mgr.GetAPIReader(), kueueWorkloads),
	}
	var proxy *url.URL
	if workerProxy != "" {
		if proxy, err = url.Parse(workerProxy); err != nil || proxy.Host == "" {
			setupLog.Error(err, "bad --worker-proxy: want a URL such as http://proxy:3128")
			os.Exit(1)
		}
	}
	// A rank its peers stopped over is asked directly, through the same proxy.
	reconciler.Supervisors = (&supervisorprobe.Prober{Proxy: proxy}).Ask
	if progressInterval > 0 {
		reconciler.Progress = &liveprogress.Poller{HTTP: liveprogress.NewClient(proxy), Interval: progressInterval}
		reconciler.ProgressPollInterval = progressInterval
	}
	if err := reconciler.SetupWithManager(mgr, concurrency); err != nil {
		setupLog.Error(err, "unable to create controller")
		os.Exit(1)
	}
	if failurePatterns != "" {
		key, err := controllers.ParseNamespacedName(failurePatterns)
		if err != nil {
			setupLog.Error(err, "bad --failure-patterns")
			os.Exit(1)
		}
		utilruntime.Must(mgr.Add(&controllers.FailurePatterns{Reader: mgr.GetAPIReader(), Key: key,
			Recorder: mgr.GetEventRecorder("zaya-operator"), Target: reconciler}))
	}
	// Always: taints added before a restart, or by an operator with other flags, expire too.
	utilruntime.Must(mgr.Add(&nodehealth.TaintExpiry{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("zaya-operator"),
		QuarantineMax: quarantineTaintMax}))
	utilruntime.Must(mgr.AddHealthzCheck("healthz", healthz.Ping))
	utilruntime.Must(mgr.AddReadyzCheck("readyz", healthz.Ping))

	setupLog.Info("starting manager", "namespaces", namespaces, "leaderElect", leaderElect)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		setupLog.Error(err, "manager exited")
		os.Exit(1)
	}
}

// metricsOptions serves metrics over HTTPS behind the API server's authentication and
// authorization when secure (HTTP/1.1 only: HTTP/2's stream resets are a known way to exhaust
// a server), else over plain HTTP.
func metricsOptions(addr string, secure bool, certDir string) metricsserver.Options {
	opts := metricsserver.Options{BindAddress: addr}
	if secure {
		opts.SecureServing, opts.CertDir = true, certDir
		opts.FilterProvider = filters.WithAuthenticationAndAuthorization
		opts.TLSOpts = []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
	}
	return opts
}
