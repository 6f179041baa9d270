package zayactl

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
)

// Preflight is what a cluster has and lacks for ZayaTrainingJobs in one namespace.
type Preflight struct {
	Namespace string  `json:"namespace"`
	Checks    []Check `json:"checks"`
	// Ready is no check failed: a job can run.
	Ready bool `json:"ready"`
}

// Check is one thing jobs need.
type Check struct {
	Name   string `json:"name"`
	Result string `json:"result"` // ok, warn or fail
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
}

// Check results.
const (
	ok   = "ok"
	warn = "warn"
	fail = "fail"
)

// Names the checks read.
const (
	crdName       = "zayatrainingjobs.training.zaya.dev"
	kueueCRD      = "workloads.kueue.x-k8s.io"
	operatorLabel = "app.kubernetes.io/name"
	operatorName  = "zaya-operator"
	gpuResource   = workerpod.ResourceAMDGPU
	nicResource   = workerpod.ResourceAMDNIC
	productLabel  = "amd.com/gpu.product-name"
	enforceLabel  = "pod-security.kubernetes.io/enforce"
)

// facts is what preflight read from the cluster; each error is the read's own.
type facts struct {
	Namespace    *corev1.Namespace
	NamespaceErr error
	CRD          *apiextensionsv1.CustomResourceDefinition
	CRDErr       error
	Operators    []appsv1.Deployment
	OperatorsErr error
	RulesKept    bool
	RulesErr     error
	Nodes        []corev1.Node
	NodesErr     error
	Classes      []storagev1.StorageClass
	ClassesErr   error
	Kueue        bool // Kueue's Workload CRD is installed
	LocalQueues  int
	QueuesErr    error
	Pods         []corev1.Pod // the namespace's job pods: their restarts tell the kubelets' back-off
	PodsErr      error
}

func (s *session) preflightCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "preflight",
		Short: "Check the cluster for what jobs need (CRD, operator, restart rules and the kubelets' back-off, AMD GPUs and NICs, storage, Kueue, Pod Security); exit 1 when a job could not run",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := s.reader()
			if err != nil {
				return err
			}
			ns, err := s.namespace()
			if err != nil {
				return err
			}
			p := preflightOf(gather(cmd.Context(), c, ns))
			if err := s.print(p, p.text); err != nil {
				return err
			}
			if !p.Ready {
				return errNotReady
			}
			return nil
		},
	}
}

// errNotReady is preflight's failure: its report said why.
var errNotReady = fmt.Errorf("a job could not run here: see the checks that failed")

// gather reads what the checks need, each read on its own: a forbidden one is a warning.
func gather(ctx context.Context, c client.Client, ns string) facts {
	var f facts
	f.Namespace = &corev1.Namespace{}
	if f.NamespaceErr = c.Get(ctx, client.ObjectKey{Name: ns}, f.Namespace); f.NamespaceErr != nil {
		f.Namespace = nil
	}
	f.CRD = &apiextensionsv1.CustomResourceDefinition{}
	if f.CRDErr = c.Get(ctx, client.ObjectKey{Name: crdName}, f.CRD); f.CRDErr != nil {
		f.CRD = nil
	}
	deps := &appsv1.DeploymentList{}
	f.OperatorsErr = c.List(ctx, deps, client.MatchingLabels{operatorLabel: operatorName})
	f.Operators = deps.Items
	probe := recovery.RulesProbe(ns)
	if err := c.Create(ctx, probe, client.DryRunAll); recovery.RefusesRestartRules(err) {
		f.RulesKept = false
	} else if err != nil {
		f.RulesErr = err
	} else {
		f.RulesKept = recovery.RulesKept(probe)
	}
	pods := &corev1.PodList{}
	f.PodsErr = c.List(ctx, pods, client.InNamespace(ns), client.HasLabels{trainingv1alpha1.JobNameLabel})
	f.Pods = pods.Items
	nodes := &corev1.NodeList{}
	f.NodesErr = c.List(ctx, nodes)
	f.Nodes = nodes.Items
	classes := &storagev1.StorageClassList{}
	f.ClassesErr = c.List(ctx, classes)
	f.Classes = classes.Items
	if err := c.Get(ctx, client.ObjectKey{Name: kueueCRD}, &apiextensionsv1.CustomResourceDefinition{}); err == nil {
		f.Kueue = true
		queues := &unstructured.UnstructuredList{}
		queues.SetGroupVersionKind(schema.GroupVersionKind{Group: "kueue.x-k8s.io", Version: "v1beta2", Kind: "LocalQueueList"})
		if f.QueuesErr = c.List(ctx, queues, client.InNamespace(ns)); f.QueuesErr == nil {
			f.LocalQueues = len(queues.Items)
		}
	}
	return f
}

// preflightOf judges the facts.
func preflightOf(f facts) Preflight {
	p := Preflight{Checks: []Check{}}
	if f.Namespace != nil {
		p.Namespace = f.Namespace.Name
	}
	add := func(c Check) { p.Checks = append(p.Checks, c) }
	add(crdCheck(f))
	add(operatorCheck(f))
	add(rulesCheck(f))
	add(backOffCheck(f))
	gpus, nics := gpuChecks(f)
	add(gpus)
	add(nics)
	add(storageCheck(f))
	if c, relevant := kueueCheck(f); relevant {
		add(c)
	}
	add(podSecurityCheck(f))
	p.Ready = !slices.ContainsFunc(p.Checks, func(c Check) bool { return c.Result == fail })
	return p
}

// unreadable is the check of a read that failed: a forbidden one cannot tell.
func unreadable(name, what string, err error) Check {
	if apierrors.IsForbidden(err) {
		return Check{Name: name, Result: warn, Detail: "cannot tell: reading " + what + " is forbidden to you", Fix: "ask a cluster admin to run kubectl zaya preflight"}
	}
	return Check{Name: name, Result: warn, Detail: fmt.Sprintf("cannot tell: reading %s: %v", what, err)}
}

func crdCheck(f facts) Check {
	const name = "CRD"
	switch {
	case apierrors.IsNotFound(f.CRDErr):
		return Check{Name: name, Result: fail, Detail: crdName + " is not installed",
			Fix: "install the chart (helm install zaya-operator charts/zaya-operator) or kubectl apply --server-side -k config/crd (docs/getting-started.md)"}
	case f.CRDErr != nil:
		return unreadable(name, "CustomResourceDefinitions", f.CRDErr)
	}
	var served []string
	history := false
	for _, v := range f.CRD.Spec.Versions {
		if v.Served {
			served = append(served, v.Name)
		}
		if v.Name == "v1alpha1" && v.Schema != nil && v.Schema.OpenAPIV3Schema != nil {
			_, history = v.Schema.OpenAPIV3Schema.Properties["status"].Properties["goodput"].Properties["history"]
		}
	}
	if !slices.Contains(served, "v1alpha1") {
		return Check{Name: name, Result: fail, Detail: fmt.Sprintf("%s serves %v, not v1alpha1", crdName, served), Fix: "install the CRD of this release (docs/upgrade.md)"}
	}
	if !history {
		return Check{Name: name, Result: warn, Detail: crdName + " is older than this plugin (no status.goodput.history): goodput timelines and why's time lost stay empty",
			Fix: "upgrade the CRD, then the operator (docs/upgrade.md)"}
	}
	return Check{Name: name, Result: ok, Detail: fmt.Sprintf("%s serves %s", crdName, strings.Join(served, ", "))}
}

func operatorCheck(f facts) Check {
	const name = "Operator"
	if f.OperatorsErr != nil {
		return unreadable(name, "Deployments", f.OperatorsErr)
	}
	if len(f.Operators) == 0 {
		return Check{Name: name, Result: fail, Detail: "no Deployment labelled " + operatorLabel + "=" + operatorName + " in any namespace: jobs would never start",
			Fix: "install the operator (docs/getting-started.md)"}
	}
	var parts []string
	ready := false
	for _, d := range f.Operators {
		image := ""
		if cs := d.Spec.Template.Spec.Containers; len(cs) > 0 {
			image = cs[0].Image
		}
		want := int32(1)
		if d.Spec.Replicas != nil {
			want = *d.Spec.Replicas
		}
		ready = ready || d.Status.ReadyReplicas > 0
		parts = append(parts, fmt.Sprintf("%s/%s (%s, %d/%d ready)", d.Namespace, d.Name, image, d.Status.ReadyReplicas, want))
	}
	if !ready {
		return Check{Name: name, Result: fail, Detail: strings.Join(parts, "; ") + ": no replica is ready",
			Fix: "kubectl -n <namespace> describe deploy, and the operator's log (docs/troubleshooting.md)"}
	}
	return Check{Name: name, Result: ok, Detail: strings.Join(parts, "; ")}
}

func rulesCheck(f facts) Check {
	const name = "In-place restart"
	switch {
	case f.RulesErr != nil:
		return unreadable(name, "a dry-run pod's answer", f.RulesErr)
	case !f.RulesKept:
		return Check{Name: name, Result: fail,
			Detail: "the API server drops container restart rules (Kubernetes before 1.35, or its ContainerRestartRules feature gate off): restartMode InPlace, the default, cannot restart a rank's worker in its pod",
			Fix:    "run Kubernetes 1.35+ with ContainerRestartRules, or give jobs faultTolerance.supervisor: Inject (zaya-supervisor restarts the worker) or restartMode: Recreate (docs/recovery.md)"}
	}
	return Check{Name: name, Result: ok, Detail: "the API server keeps container restart rules: the kubelet restarts a failed rank's worker in its pod"}
}

// gpuChecks counts the nodes that offer AMD GPUs, and whether their NICs fit the default
// PollaraAINIC profile (one amd.com/nic per GPU).
func gpuChecks(f facts) (gpus, nics Check) {
	if f.NodesErr != nil {
		return unreadable("AMD GPUs", "Nodes", f.NodesErr), unreadable("AMD NICs", "Nodes", f.NodesErr)
	}
	bySize := map[int64]int{}
	var gpuNodes, unlabelled, mi300x, fitting int
	for _, n := range f.Nodes {
		q, has := n.Status.Allocatable[gpuResource]
		if !has || q.Value() <= 0 {
			continue
		}
		gpuNodes++
		bySize[q.Value()]++
		if n.Labels[workerpod.LabelAMDGPU] != "true" && n.Labels[workerpod.LabelAMDVGPU] != "true" {
			unlabelled++
		}
		if strings.Contains(n.Labels[productLabel], "MI300X") || n.Labels["amd.com/gpu.device-id"] == "74a1" {
			mi300x++
		}
		if nic, has := n.Status.Allocatable[nicResource]; has && nic.Value() >= q.Value() {
			fitting++
		}
	}
	if gpuNodes == 0 {
		gpus = Check{Name: "AMD GPUs", Result: fail, Detail: fmt.Sprintf("none of %d nodes offers %s", len(f.Nodes), gpuResource),
			Fix: "install AMD's GPU operator or device plugin (docs/getting-started.md); on kind, make test-kind's fake device plugin"}
		return gpus, Check{Name: "AMD NICs", Result: warn, Detail: "no GPU nodes to look at"}
	}
	var sizes []string
	keys := make([]int64, 0, len(bySize))
	for k := range bySize {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] > keys[j] })
	for _, k := range keys {
		sizes = append(sizes, fmt.Sprintf("%d with %d", bySize[k], k))
	}
	gpus = Check{Name: "AMD GPUs", Result: ok, Detail: fmt.Sprintf("%d nodes offer %s (%s), %d labelled MI300X", gpuNodes, gpuResource, strings.Join(sizes, ", "), mi300x)}
	if unlabelled > 0 {
		gpus.Result = warn
		gpus.Detail += fmt.Sprintf("; %d lack NFD's %s=true (or amd-vgpu): jobs with gpuNodeSelector NodeFeatureDiscovery keep off them", unlabelled, workerpod.LabelAMDGPU)
		gpus.Fix = "install Node Feature Discovery with AMD's rules (the GPU operator does), or use gpuNodeSelector: None"
	}
	switch fitting {
	case gpuNodes:
		nics = Check{Name: "AMD NICs", Result: ok, Detail: fmt.Sprintf("every GPU node offers one %s per GPU: the PollaraAINIC profile (the default) fits", nicResource)}
	case 0:
		nics = Check{Name: "AMD NICs", Result: warn, Detail: fmt.Sprintf("no GPU node offers one %s per GPU: jobs with the default PollaraAINIC profile would never be placed", nicResource),
			Fix: "set spec.network.profile: Socket (TCP) or RoCE with nicsPerNode, or install AMD's network operator (docs/rccl-profile.md)"}
	default:
		nics = Check{Name: "AMD NICs", Result: warn, Detail: fmt.Sprintf("%d of %d GPU nodes offer one %s per GPU: PollaraAINIC jobs fit only those", fitting, gpuNodes, nicResource),
			Fix: "docs/rccl-profile.md"}
	}
	return gpus, nics
}

// rwxProvisioners are provisioners whose volumes can be ReadWriteMany (file systems).
var rwxProvisioners = []string{"nfs", "file", "cephfs", "efs", "azurefile", "filestore", "gluster", "lustre", "weka", "vast", "spectrumscale", "beegfs"}

func storageCheck(f facts) Check {
	const name = "Checkpoint storage"
	if f.ClassesErr != nil {
		return unreadable(name, "StorageClasses", f.ClassesErr)
	}
	var rwx []string
	for _, c := range f.Classes {
		if slices.ContainsFunc(rwxProvisioners, func(p string) bool { return strings.Contains(strings.ToLower(c.Provisioner), p) }) {
			rwx = append(rwx, c.Name+" ("+c.Provisioner+")")
		}
	}
	if len(rwx) == 0 {
		return Check{Name: name, Result: warn, Detail: fmt.Sprintf("none of %d storage classes looks like a file system that gives ReadWriteMany: checkpoint.volume.new needs one", len(f.Classes)),
			Fix: "claim an existing ReadWriteMany volume (checkpoint.volume.claimName), or add a file storage class whose volumes the workers' uid can write (docs/ibm-cloud.md for VPC file)"}
	}
	return Check{Name: name, Result: ok, Detail: "ReadWriteMany candidates: " + strings.Join(rwx, ", ") + "; the workers' uid must be able to write them (a class's uid/gid parameters)"}
}

// kueueCheck applies where Kueue is installed.
func kueueCheck(f facts) (Check, bool) {
	const name = "Kueue"
	if !f.Kueue {
		return Check{}, false
	}
	workloads := slices.ContainsFunc(f.Operators, func(d appsv1.Deployment) bool {
		return slices.ContainsFunc(d.Spec.Template.Spec.Containers, func(c corev1.Container) bool {
			return slices.ContainsFunc(append(slices.Clone(c.Command), c.Args...), func(a string) bool { return a == "--kueue-workloads" || a == "--kueue-workloads=true" })
		})
	})
	how := "Kueue is installed; the operator serves its pod groups (a job's pods labelled with a queue)"
	if workloads {
		how = "Kueue is installed and the operator runs with --kueue-workloads (a job labelled with a queue is one Workload)"
	}
	switch {
	case f.QueuesErr != nil:
		return unreadable(name, "LocalQueues", f.QueuesErr), true
	case f.LocalQueues == 0:
		return Check{Name: name, Result: warn, Detail: how + "; this namespace has no LocalQueue: a job labelled with a queue waits forever",
			Fix: "create a LocalQueue here pointing at a ClusterQueue (docs/kueue.md), or label no queue"}, true
	}
	return Check{Name: name, Result: ok, Detail: fmt.Sprintf("%s; %d LocalQueue(s) in this namespace", how, f.LocalQueues)}, true
}

func podSecurityCheck(f facts) Check {
	const name = "Pod Security"
	switch {
	case apierrors.IsNotFound(f.NamespaceErr):
		return Check{Name: name, Result: fail, Detail: "the namespace does not exist", Fix: "kubectl create namespace, or -n another"}
	case f.NamespaceErr != nil:
		return unreadable(name, "the namespace", f.NamespaceErr)
	}
	level := f.Namespace.Labels[enforceLabel]
	switch level {
	case "", "privileged":
		return Check{Name: name, Result: ok, Detail: fmt.Sprintf("the namespace enforces %q: worker pods of every network profile are admitted", orDash(level, "privileged (no label)"))}
	case "baseline", "restricted":
		return Check{Name: name, Result: warn,
			Detail: fmt.Sprintf("the namespace enforces %q: the RDMA profiles' IPC_LOCK (PollaraAINIC, RoCE) is refused; Socket jobs run%s", level,
				map[string]string{"baseline": "", "restricted": " with a template that passes restricted"}[level]),
			Fix: "docs/security.md: a namespace at privileged for RDMA jobs, or the Socket profile"}
	}
	return Check{Name: name, Result: warn, Detail: fmt.Sprintf("the namespace's %s is %q, no level Kubernetes knows", enforceLabel, level)}
}

func (p Preflight) text(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "Namespace %s:\n\n", shown(orDash(p.Namespace, "?")))
	fmt.Fprintln(tw, "CHECK\tRESULT\tDETAIL")
	for _, c := range p.Checks {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Name, strings.ToUpper(c.Result), shown(c.Detail))
		if c.Fix != "" && c.Result != ok {
			fmt.Fprintf(tw, "\t\tfix: %s\n", shown(c.Fix))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	verdict := "\nReady: a job can run here.\n"
	if !p.Ready {
		verdict = "\nNot ready: a job could not run here (the checks that FAIL say why).\n"
	}
	_, err := fmt.Fprint(w, verdict)
	return err
}
