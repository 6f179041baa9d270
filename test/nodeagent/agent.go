package nodeagent

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
)

// Options configure an Agent.
type Options struct {
	Client kubernetes.Interface
	// Nodes are the names of the nodes this agent registers and plays.
	Nodes []string
	// Labels and Taints go on every node (the MI300X labels are added by the agent).
	Labels map[string]string
	Taints []corev1.Taint
	// WorkDir holds pod folders and volumes: <WorkDir>/pods/<ns>_<pod>_<uid>/ and
	// <WorkDir>/volumes/<ns>/<claim>/ (one folder per claim, so ranks share checkpoints).
	WorkDir string
	// Commands maps a container's command[0] to an executable on this machine.
	Commands map[string]string
	// MaxContainerRestartPeriod caps the back-off between restarts of a container that its
	// restart rules or policy restart in place, as the kubelet's crashLoopBackOff setting of
	// that name does (0: the kubelet's default, 300 s). The first restart is immediate.
	MaxContainerRestartPeriod time.Duration
	// NodeMonitorGracePeriod is how long after NodeDown the node turns NotReady, as the node
	// lifecycle controller marks a node whose kubelet went silent (50 s by default on a real
	// cluster); until then it looks Ready and only its Lease tells. Zero: 30 s.
	NodeMonitorGracePeriod time.Duration
	// RelistPeriod is how often the kubelet's PLEG relists its containers: an exit is seen,
	// reported and restarted at the first relist after it, not the moment the process ends
	// (kind showed a killed rank's exit reaching the API server after its peers' stops).
	// Zero: the kubelet's 1 s; negative: at once.
	RelistPeriod time.Duration
	// LeaseDuration is the nodes' Lease duration, renewed every quarter of it as a kubelet
	// does. Zero: 20 s (a kubelet's default is 40 s: 20 s lets a test see a Lease lapse in
	// seconds rather than half a minute).
	LeaseDuration time.Duration
	// Logf reports what the agent does (nil: nothing).
	Logf func(format string, args ...any)
	// HostsFile, where set (/etc/hosts, if the agent may write it), is where the agent
	// publishes its running pods' DNS names, and processes keep the names in their
	// environment and resolve them as they dial (hosts.go). Empty: a process's environment
	// gets its peers' addresses as it starts.
	HostsFile string
	// Config is how processes reach the API server. With it, a pod that mounts its
	// service-account token gets a token bound to the pod (TokenRequest) in a kubeconfig named
	// by KUBECONFIG, since the in-cluster paths are absolute; without it, pods get no token.
	Config *rest.Config
}

// Agent plays kubelet for Options.Nodes.
type Agent struct {
	opts   Options
	life   context.Context // Start's: nothing the agent does outlives it
	pods   listersv1.PodLister
	queue  workqueue.TypedRateLimitingInterface[string]
	nodeOf map[string]bool

	mu   sync.Mutex
	runs map[string]*run // by namespace/name
	// orphans are the runs of pods replaced by a pod of the same name while their node was
	// frozen: a hung host's kubelet knows nothing of the new pod and leaves the old process as
	// it is until the node comes back (Thaw).
	orphans []*run
	down    map[string]bool
	gpus    map[string]int64 // allocatable amd.com/gpu per node
	nextIP  uint32

	hostsID    string   // names the agent's block of HostsFile
	hostsLines []string // the block as last written
}

// run is one pod's process.
type run struct {
	uid       types.UID
	node, ip  string
	grace     time.Duration // the pod's termination grace period
	dir       string
	cmd       *exec.Cmd
	env       []string
	paths     []mapping
	started   time.Time
	exited    chan struct{} // closed when the pod's container has exited for good
	instance  chan struct{} // closed when the current process exits (restarts make new ones)
	exitCode  int
	deleting  bool
	stopping  bool          // stop was called: no more restarts
	stopNow   chan struct{} // closed by stop
	bin       string
	argv      []string
	logFile   *os.File
	runLog    *os.File // this run's own log
	restarts  int32
	lastState corev1.ContainerState // the previous instance's end, once restarted
	logPath   string
	termPath  string
	container corev1.Container
	ready     bool // the readiness probe's last verdict, as reported
	// probeKilled: the liveness probe killed the running process. The real kubelet then
	// restarts the container by its restart policy alone: restart rules cover only the
	// container's own exits (seen on kind, v1.36).
	probeKilled bool
}

const gpuCapacity = 8

// FieldManager names the agent's writes (nodes, their status and Leases, pods' status), so
// tests can tell them from anyone else's in managedFields.
const FieldManager = "zaya-nodeagent"

// KwokNodeAnnotation marks the nodes kwok plays kubelet for on the local cluster
// (hack/cluster/kwokctl.yaml). The agent's nodes never carry it: they have one kubelet, this.
const KwokNodeAnnotation = "kwok.x-k8s.io/node"

// Start registers the nodes and starts playing their pods until ctx ends.
func Start(ctx context.Context, opts Options) (*Agent, error) {
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	a := &Agent{
		opts:    opts,
		life:    ctx,
		queue:   workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		nodeOf:  map[string]bool{},
		runs:    map[string]*run{},
		down:    map[string]bool{},
		gpus:    map[string]int64{},
		nextIP:  firstIP(),
		hostsID: newHostsID(),
	}
	for _, n := range opts.Nodes {
		a.nodeOf[n] = true
		a.gpus[n] = gpuCapacity
		if err := a.register(ctx, n); err != nil {
			return nil, fmt.Errorf("nodeagent: registering node %s: %w", n, err)
		}
	}
	factory := informers.NewSharedInformerFactory(opts.Client, 0)
	inf := factory.Core().V1().Pods()
	a.pods = inf.Lister()
	enqueue := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				p, _ = d.Obj.(*corev1.Pod)
			}
		}
		if p != nil && a.nodeOf[p.Spec.NodeName] {
			a.queue.Add(p.Namespace + "/" + p.Name)
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }, DeleteFunc: enqueue,
	}); err != nil {
		return nil, err
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	for range 8 {
		go a.work(ctx)
	}
	go a.heartbeat(ctx)
	if opts.HostsFile != "" {
		go a.publishHosts(ctx)
	}
	go func() {
		<-ctx.Done()
		a.queue.ShutDown()
		a.killAll()
	}()
	return a, nil
}

func (a *Agent) work(ctx context.Context) {
	for {
		key, quit := a.queue.Get()
		if quit {
			return
		}
		requeue, err := a.sync(ctx, key)
		switch {
		case err != nil:
			a.opts.Logf("nodeagent: %s: %v", key, err)
			a.queue.AddRateLimited(key)
		case requeue > 0:
			a.queue.Forget(key)
			a.queue.AddAfter(key, requeue)
		default:
			a.queue.Forget(key)
		}
		a.queue.Done(key)
	}
}

// register creates (or takes over) a node that looks like an IBM Cloud MI300X worker.
func (a *Agent) register(ctx context.Context, name string) error {
	c := a.opts.Client.CoreV1().Nodes()
	labels := map[string]string{
		"kubernetes.io/hostname":                   name,
		"kubernetes.io/os":                         "linux",
		"kubernetes.io/arch":                       "amd64",
		"node.kubernetes.io/instance-type":         "gx3d.208x1792.8mi300x", // IKS's flavor form: dots
		"ibm-cloud.kubernetes.io/machine-type":     "gx3d.208x1792.8mi300x",
		"amd.com/gpu.product-name":                 "AMD_Instinct_MI300X_OAM",
		"amd.com/gpu.device-id":                    "74a1",
		"amd.com/gpu.family":                       "AI",
		"feature.node.kubernetes.io/amd-gpu":       "true",
		"ibm-cloud.kubernetes.io/worker-pool-name": "mi300x-process",
		"topology.kubernetes.io/zone":              "local-1",
	}
	for k, v := range a.opts.Labels {
		labels[k] = v
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       corev1.NodeSpec{Taints: a.opts.Taints},
	}
	existing, err := c.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if _, err := c.Create(ctx, node, metav1.CreateOptions{FieldManager: FieldManager}); err != nil {
			return err
		}
	case err != nil:
		return err
	default: // left by an earlier agent (or anyone): take it over as it is declared now
		existing.Labels, existing.Spec.Taints = labels, a.opts.Taints
		delete(existing.Annotations, KwokNodeAnnotation)
		if _, err := c.Update(ctx, existing, metav1.UpdateOptions{FieldManager: FieldManager}); err != nil {
			return err
		}
	}
	return a.postStatus(ctx, name)
}

func (a *Agent) nodeStatus(name string, gpus int64) corev1.NodeStatus {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("208"),
		corev1.ResourceMemory: resource.MustParse("1792Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
		"amd.com/gpu":         *resource.NewQuantity(gpuCapacity, resource.DecimalSI),
		"amd.com/nic":         *resource.NewQuantity(8, resource.DecimalSI),
	}
	alloc := capacity.DeepCopy()
	alloc["amd.com/gpu"] = *resource.NewQuantity(gpus, resource.DecimalSI)
	now := metav1.Now()
	return corev1.NodeStatus{
		Capacity: capacity, Allocatable: alloc, Phase: corev1.NodeRunning,
		Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "nodeagent is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now,
		}},
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}, {Type: corev1.NodeHostName, Address: name}},
		NodeInfo:  corev1.NodeSystemInfo{KubeletVersion: "nodeagent", OperatingSystem: "linux", Architecture: "amd64"},
	}
}

// postStatus is the kubelet's status update: Ready, resources, heartbeat; and its Lease.
func (a *Agent) postStatus(ctx context.Context, name string) error {
	a.mu.Lock()
	gpus, down := a.gpus[name], a.down[name]
	a.mu.Unlock()
	if down {
		return nil
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := a.opts.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		st := a.nodeStatus(name, gpus)
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				st.Conditions[0].LastTransitionTime = c.LastTransitionTime
			}
		}
		n.Status = st
		_, err = a.opts.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{FieldManager: FieldManager})
		return err
	})
	if err != nil {
		return err
	}
	leases := a.opts.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: corev1.NamespaceNodeLease},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To(a.leaseSeconds()), RenewTime: &now},
		}, metav1.CreateOptions{FieldManager: FieldManager})
		if !apierrors.IsAlreadyExists(err) {
			return err
		}
		// Created between our Get and Create (a fresh cluster's controllers may): renew it.
		l, err = leases.Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return err
	}
	// The node's Lease is its kubelet's: held by the node's name, as a kubelet holds it.
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = ptr.To(name), ptr.To(a.leaseSeconds()), &now
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{FieldManager: FieldManager})
	return err
}

// leaseSeconds is the nodes' Lease duration in whole seconds (Options.LeaseDuration).
func (a *Agent) leaseSeconds() int32 {
	if a.opts.LeaseDuration >= time.Second {
		return int32(a.opts.LeaseDuration / time.Second)
	}
	return 20
}

// heartbeat posts the nodes' status and renews their Leases every quarter of the Lease.
func (a *Agent) heartbeat(ctx context.Context) {
	t := time.NewTicker(time.Duration(a.leaseSeconds()) * time.Second / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			for _, n := range a.opts.Nodes {
				if err := a.postStatus(ctx, n); err != nil && ctx.Err() == nil {
					a.opts.Logf("nodeagent: node %s status: %v", n, err)
				}
			}
		}
	}
}

// sync brings one pod's process in line with the pod; it may ask to be called again later.
func (a *Agent) sync(ctx context.Context, key string) (time.Duration, error) {
	ns, name, _ := strings.Cut(key, "/")
	pod, err := a.pods.Pods(ns).Get(name)
	a.mu.Lock()
	r := a.runs[key]
	a.mu.Unlock()
	if apierrors.IsNotFound(err) {
		if r != nil && !a.isDown(r.node) { // a dead kubelet never learns its pod is gone
			a.stop(r, 0)
			a.forget(key, r)
		}
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if a.isDown(pod.Spec.NodeName) {
		return 0, nil // a dead kubelet does nothing
	}
	if r != nil && r.uid != pod.UID { // a new pod with an old pod's name
		if a.isDown(r.node) {
			a.orphan(key, r)
		} else {
			a.stop(r, 0)
			a.forget(key, r)
		}
		r = nil
	}
	if r == nil && !a.nodeOf[pod.Spec.NodeName] {
		// Not bound to a node of ours: the old pod's key brought a new pod of its name that the
		// scheduler has not placed yet (a replaced rank). A kubelet runs only its node's pods;
		// started here, it ran nowhere, and its binding's event came too late to place it.
		return 0, nil
	}
	if pod.DeletionTimestamp != nil {
		if r == nil || r.exitedNow() {
			return 0, a.remove(ctx, pod)
		}
		a.mu.Lock()
		already := r.deleting
		r.deleting = true
		a.mu.Unlock()
		if !already {
			grace := int64(30)
			if pod.DeletionGracePeriodSeconds != nil {
				grace = *pod.DeletionGracePeriodSeconds
			}
			go a.stop(r, time.Duration(grace)*time.Second)
		}
		return 0, nil
	}
	if r != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return 0, nil
	}
	return a.start(ctx, pod)
}

func (r *run) exitedNow() bool {
	select {
	case <-r.exited:
		return true
	default:
		return false
	}
}

// orphan keeps r, whose frozen node's kubelet cannot know its pod was replaced, apart from
// the run of the new pod of its name.
func (a *Agent) orphan(key string, r *run) {
	a.mu.Lock()
	if a.runs[key] == r {
		delete(a.runs, key)
	}
	a.orphans = append(a.orphans, r)
	a.mu.Unlock()
}

func (a *Agent) forget(key string, r *run) {
	a.mu.Lock()
	if a.runs[key] == r {
		delete(a.runs, key)
	}
	a.mu.Unlock()
}

// remove is the kubelet's final delete once the pod's processes are gone.
func (a *Agent) remove(ctx context.Context, pod *corev1.Pod) error {
	err := a.opts.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &pod.UID},
	})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// stop sends SIGTERM to the pod's process group, then SIGKILL after grace; the container is
// not restarted any more.
func (a *Agent) stop(r *run, grace time.Duration) {
	a.mu.Lock()
	if !r.stopping {
		r.stopping = true
		close(r.stopNow)
	}
	cmd := r.cmd
	a.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	pgid := -cmd.Process.Pid
	if grace > 0 {
		_ = syscall.Kill(pgid, syscall.SIGTERM)
		select {
		case <-r.exited:
			return
		case <-time.After(grace):
		}
	}
	_ = signalContainer(cmd.Process.Pid, syscall.SIGKILL)
	<-r.exited
}

func (a *Agent) killAll() {
	a.mu.Lock()
	runs := make([]*run, 0, len(a.runs)+len(a.orphans))
	for _, r := range a.runs {
		runs = append(runs, r)
	}
	runs = append(runs, a.orphans...)
	a.mu.Unlock()
	for _, r := range runs {
		a.stop(r, 0)
	}
}

var podDNS = regexp.MustCompile(`^([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.svc(\.cluster\.local)?\.?$`)

// resolve is the pod DNS the contract uses: the address of the live pod with that hostname
// and subdomain in ns, "" while it has none.
func (a *Agent) resolve(self *corev1.Pod, selfIP, ns, host, sub string) string {
	if self.Spec.Hostname == host && self.Spec.Subdomain == sub {
		return selfIP
	}
	pods, _ := a.pods.Pods(ns).List(labels.Everything())
	for _, p := range pods {
		if p.Spec.Hostname == host && p.Spec.Subdomain == sub && p.DeletionTimestamp == nil &&
			p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
			return processIP(p.Status.PodIP)
		}
	}
	return ""
}

// firstIP is where an agent's addresses begin: a random block of 127.1.0.0/16, so that two
// agents on one machine (two e2e suites at once: a soak beside CI) do not hand out the same
// address, whose ports the other's processes then find taken (seen: "bind: address already in
// use" on 127.1.0.15, both agents having begun at 127.1.0.1). A block is 250 addresses; a
// run of the suite uses a few hundred, and 56 blocks stay above the highest start.
func firstIP() uint32 { return 250 * uint32(rand.IntN(200)) }

// Pods report 10.244.x.y (the API refuses loopback endpoints for their Service); their
// processes use 127.1.x.y, which the downward API and pod DNS hand out.
func statusIP(ip string) string { return "10.244." + strings.TrimPrefix(ip, "127.1.") }

func processIP(ip string) string {
	if rest, ok := strings.CutPrefix(ip, "10.244."); ok {
		return "127.1." + rest
	}
	return ip
}

// start sets up the pod's folders and starts its process.
func (a *Agent) start(ctx context.Context, pod *corev1.Pod) (time.Duration, error) {
	if len(pod.Spec.Containers) != 1 {
		return 0, a.finish(ctx, pod, nil, 127, "StartError", "nodeagent runs pods of exactly one container")
	}
	c := pod.Spec.Containers[0]
	key := pod.Namespace + "/" + pod.Name
	a.mu.Lock()
	ip := fmt.Sprintf("127.1.%d.%d", a.nextIP/250, a.nextIP%250+1)
	a.nextIP++ // never reused, even if this start waits for a peer's name
	a.mu.Unlock()

	dir := filepath.Join(a.opts.WorkDir, "pods", fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID))
	paths, err := a.volumes(pod, &c, dir)
	if err != nil {
		return 0, err
	}
	env, unresolved := a.environment(pod, &c, ip, paths)
	if unresolved != "" {
		return 250 * time.Millisecond, nil // the peer's name resolves once it runs
	}
	if retry, done, err := a.initialize(ctx, pod, dir, ip); !done || err != nil {
		return retry, err
	}
	kubeconfig, err := a.serviceAccountKubeconfig(ctx, pod, dir)
	if err != nil {
		return 0, err
	}
	if kubeconfig != "" {
		env = append(env, "KUBECONFIG="+kubeconfig)
	}
	argv := append(append([]string{}, c.Command...), c.Args...)
	if len(argv) == 0 && isPauseImage(c.Image) {
		// The one image it knows: pause holds the pod until it is stopped, then exits 0.
		argv = []string{"/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1 & wait $!; done"}
	}
	if len(argv) == 0 {
		return 0, a.finish(ctx, pod, nil, 127, "StartError", "the container has no command: nodeagent cannot run images")
	}
	argv = resolveArgs(argv, env, paths)
	bin, ok := a.command(argv[0], dir)
	if argv[0] == "/bin/sh" && isPauseImage(c.Image) {
		bin, ok = "/bin/sh", true
	}
	if !ok {
		return 0, a.finish(ctx, pod, nil, 127, "StartError", fmt.Sprintf("nodeagent knows no command %q", argv[0]))
	}
	r := &run{uid: pod.UID, node: pod.Spec.NodeName, grace: terminationGrace(pod), ip: ip, dir: dir, env: env, paths: paths, exited: make(chan struct{}),
		stopNow: make(chan struct{}), bin: bin, argv: argv[1:],
		logPath: filepath.Join(dir, c.Name+".log"), termPath: terminationPath(&c, paths), container: c}
	if err := a.launch(r); err != nil {
		return 0, a.finish(ctx, pod, nil, 127, "StartError", err.Error())
	}
	a.mu.Lock()
	a.runs[key] = r
	pid := r.cmd.Process.Pid
	a.mu.Unlock()
	a.opts.Logf("nodeagent: %s started on %s at %s (pid %d)", key, pod.Spec.NodeName, ip, pid)
	go a.supervise(ctx, key, pod, r)
	return 0, nil
}

// resolveArgs expands $(VAR) references in argv as the kubelet does and maps the container's
// mount paths to the pod's folders on this machine.
func resolveArgs(argv, env []string, paths []mapping) []string {
	lookup := func(name string) (string, bool) { return envValue(env, name) }
	out := make([]string, len(argv))
	for i := range argv {
		out[i] = rewrite(expand(argv[i], lookup), paths)
	}
	return out
}

// command is the program to run for a container's argv[0]: a file in one of the pod's own
// volumes runs as itself (an init container put it there, as a kubelet's container would
// find it); any other name or path is looked up among the commands the agent knows, by its
// full name and then by its base name (/usr/local/bin/zaya-supervisor is zaya-supervisor).
func (a *Agent) command(name, podDir string) (string, bool) {
	if rel, err := filepath.Rel(podDir, name); err == nil && filepath.IsAbs(name) && !strings.HasPrefix(rel, "..") {
		if st, err := os.Stat(name); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0 {
			return name, true
		}
		return "", false
	}
	if bin, ok := a.opts.Commands[name]; ok {
		return bin, true
	}
	if strings.Contains(name, "/") {
		bin, ok := a.opts.Commands[filepath.Base(name)]
		return bin, ok
	}
	return "", false
}

// initTimeout bounds one init container's run: the agent runs them in its sync loop.
const initTimeout = 2 * time.Minute

// initialize runs the pod's init containers in order, each to completion, before its
// container starts, as a kubelet does, and reports each one's end in initContainerStatuses.
// done is false while one must be retried (restartPolicy OnFailure: after retry); a failure
// under restartPolicy Never fails the pod, as the kubelet's Init:Error does.
func (a *Agent) initialize(ctx context.Context, pod *corev1.Pod, dir, ip string) (retry time.Duration, done bool, err error) {
	var statuses []corev1.ContainerStatus
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		paths, err := a.volumes(pod, c, dir)
		if err != nil {
			return 0, false, err
		}
		env, unresolved := a.environment(pod, c, ip, paths)
		if unresolved != "" {
			return 250 * time.Millisecond, false, nil
		}
		argv := resolveArgs(append(append([]string{}, c.Command...), c.Args...), env, paths)
		code, msg := 127, fmt.Sprintf("nodeagent knows no command %q", argv)
		started := metav1.Now()
		if len(argv) > 0 {
			if bin, ok := a.command(argv[0], dir); ok {
				code, msg = a.runInit(ctx, c, bin, argv[1:], env, dir, paths)
			}
		}
		reason := "Completed"
		if code != 0 {
			reason = "Error"
		}
		statuses = append(statuses, corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: "nodeagent://" + c.Image,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: int32(code), Reason: reason, Message: msg,
				StartedAt: started, FinishedAt: metav1.Now()}}})
		if code != 0 {
			a.opts.Logf("nodeagent: %s/%s: init container %s exited %d: %s", pod.Namespace, pod.Name, c.Name, code, msg)
			if pod.Spec.RestartPolicy == corev1.RestartPolicyNever {
				return 0, false, a.updateStatus(ctx, pod, func(st *corev1.PodStatus) {
					st.Phase = corev1.PodFailed
					st.InitContainerStatuses = statuses
					st.Conditions = conditions(corev1.ConditionFalse, metav1.Now())
					st.Conditions[1].Status = corev1.ConditionFalse
				})
			}
			return 10 * time.Second, false, nil // the kubelet's first back-off
		}
	}
	if len(statuses) == 0 {
		return 0, true, nil
	}
	return 0, true, a.updateStatus(ctx, pod, func(st *corev1.PodStatus) { st.InitContainerStatuses = statuses })
}

// runInit runs one init container's process to its end: its exit code and termination
// message (its log's tail under FallbackToLogsOnError).
func (a *Agent) runInit(ctx context.Context, c *corev1.Container, bin string, args, env []string, dir string, paths []mapping) (int, string) {
	ctx, cancel := context.WithTimeout(ctx, initTimeout)
	defer cancel()
	logPath := filepath.Join(dir, c.Name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return 127, err.Error()
	}
	defer func() { _ = logf.Close() }()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr = env, dir, logf, logf
	code := exitCode(cmd.Run())
	msg := readTail(terminationPath(c, paths), 4096)
	if msg == "" && code != 0 && c.TerminationMessagePolicy == corev1.TerminationMessageFallbackToLogsOnError {
		msg = logTail(logPath, 2048, 80)
	}
	return code, msg
}

// isPauseImage reports whether image is a pause image (registry.k8s.io/pause:3.10.2, a mirror).
func isPauseImage(image string) bool {
	name := image[strings.LastIndexByte(image, '/')+1:]
	return name == "pause" || strings.HasPrefix(name, "pause:") || strings.HasPrefix(name, "pause@")
}

// errStopped refuses to start a container whose pod is being stopped.
var errStopped = errors.New("nodeagent: the pod is being stopped")

// launch starts the container's process (again, after a restart: same address, folder and
// environment; the log is appended to, the termination log starts empty as a new container's).
func (a *Agent) launch(r *run) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r.stopping {
		return errStopped
	}
	logf, err := os.OpenFile(r.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	// And each run's own, as a kubelet keeps <restartCount>.log per container.
	runf, err := os.Create(RunLogPath(r.logPath, r.restarts))
	if err != nil {
		_ = logf.Close()
		return err
	}
	cmd := exec.Command(r.bin, r.argv...)
	cmd.Env, cmd.Dir = r.env, r.dir
	out := io.MultiWriter(logf, runf)
	cmd.Stdout, cmd.Stderr = out, out
	// A session of its own: the container's processes, whatever groups they make (a
	// supervisor puts its worker in one of its own), as a PID namespace holds them.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		_ = runf.Close()
		return err
	}
	r.cmd, r.logFile, r.runLog, r.started, r.instance = cmd, logf, runf, time.Now(), make(chan struct{})
	r.ready = r.container.ReadinessProbe == nil
	return nil
}

// supervise reports each process of the container running, probes it, and when it exits
// either restarts it in place (its restart rules or policy say so, as a kubelet's
// ContainerShouldRestart does) or reports the container terminated for good.
func (a *Agent) supervise(ctx context.Context, key string, pod *corev1.Pod, r *run) {
	for {
		a.mu.Lock()
		cmd, inst, logf, runf := r.cmd, r.instance, r.logFile, r.runLog
		a.mu.Unlock()
		if err := a.running(ctx, pod, r); err != nil && ctx.Err() == nil {
			a.opts.Logf("nodeagent: %s: reporting running: %v", key, err)
		}
		probeCtx, stopProbes := context.WithCancel(ctx)
		a.startProbes(probeCtx, key, pod, r)
		err := cmd.Wait()
		stopProbes()
		_ = logf.Close()
		_ = runf.Close()
		code, finishedAt := exitCode(err), metav1.Now()
		close(inst)
		a.awaitRelist(ctx)
		a.mu.Lock()
		down, stopping, probeKilled := a.down[r.node], r.stopping, r.probeKilled
		r.probeKilled = false
		a.mu.Unlock()
		if down || ctx.Err() != nil {
			r.exitCode = code
			close(r.exited)
			return
		}
		msg := readTail(r.termPath, 4096)
		if msg == "" && code != 0 && r.container.TerminationMessagePolicy == corev1.TerminationMessageFallbackToLogsOnError {
			msg = logTail(RunLogPath(r.logPath, r.restarts), 2048, 80)
		}
		reason := "Completed"
		if code != 0 {
			reason = "Error"
		}
		restart := shouldRestart(pod, &r.container, code)
		if probeKilled {
			restart = policyRestarts(pod, &r.container, code)
		}
		if !stopping && restart && a.restart(ctx, key, pod, r, &corev1.ContainerStateTerminated{
			ExitCode: int32(code), Reason: reason, Message: msg, StartedAt: metav1.NewTime(r.started), FinishedAt: finishedAt,
			ContainerID: fmt.Sprintf("nodeagent://%d", cmd.Process.Pid),
		}) {
			continue
		}
		r.exitCode = code
		close(r.exited)
		if err := a.finish(ctx, pod, r, code, reason, msg); err != nil {
			a.opts.Logf("nodeagent: %s: reporting exit: %v", key, err)
		}
		a.queue.Add(key) // a pod being deleted can go now
		return
	}
}

// awaitRelist waits for the node's next relist: relists tick every RelistPeriod on the
// clock, so exits at once on several nodes are seen together or a period apart, as a real
// kubelet's are.
func (a *Agent) awaitRelist(ctx context.Context) {
	period := a.opts.RelistPeriod
	if period == 0 {
		period = time.Second
	}
	if period < 0 {
		return
	}
	select {
	case <-ctx.Done():
	case <-time.After(period - time.Duration(time.Now().UnixNano()%int64(period))):
	}
}

// restart waits out the back-off and starts the container again; false when the pod is
// being stopped meanwhile (or the process cannot start), so the container ends here.
func (a *Agent) restart(ctx context.Context, key string, pod *corev1.Pod, r *run, ended *corev1.ContainerStateTerminated) bool {
	a.mu.Lock()
	r.restarts++
	r.lastState = corev1.ContainerState{Terminated: ended}
	n := r.restarts
	a.mu.Unlock()
	if delay := restartDelay(n, a.opts.MaxContainerRestartPeriod); delay > 0 {
		msg := fmt.Sprintf("back-off %v restarting failed container %s", delay, r.container.Name)
		if err := a.waiting(ctx, pod, r, "CrashLoopBackOff", msg); err != nil && ctx.Err() == nil {
			a.opts.Logf("nodeagent: %s: reporting back-off: %v", key, err)
		}
		select {
		case <-time.After(delay):
		case <-r.stopNow:
			return false
		case <-ctx.Done():
			return false
		}
	}
	if !a.reresolve(ctx, pod, r) {
		return false
	}
	_ = os.Truncate(r.termPath, 0)
	if err := a.launch(r); err != nil {
		if !errors.Is(err, errStopped) {
			a.opts.Logf("nodeagent: %s: restarting: %v", key, err)
		}
		return false
	}
	a.opts.Logf("nodeagent: %s restarted in place (restart %d, exit %d)", key, n, ended.ExitCode)
	return true
}

// reresolve looks the pod DNS names in the container's env up again before a restart: a
// process resolves them when it dials, so a peer whose pod was replaced meanwhile (same name,
// new address) is reached at its new address. It waits while a name has no address; false
// when the pod is stopped meanwhile.
func (a *Agent) reresolve(ctx context.Context, pod *corev1.Pod, r *run) bool {
	for {
		env, unresolved := a.environment(pod, &r.container, r.ip, r.paths)
		if unresolved == "" {
			a.mu.Lock()
			if kc, ok := envValue(r.env, "KUBECONFIG"); ok {
				env = append(env, "KUBECONFIG="+kc)
			}
			r.env = env
			a.mu.Unlock()
			return true
		}
		select {
		case <-time.After(250 * time.Millisecond):
		case <-r.stopNow:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// restartDelay is the kubelet's crash-loop back-off before the n-th restart: none for the
// first, then 10 s doubling, capped at limit (default 300 s).
func restartDelay(n int32, limit time.Duration) time.Duration {
	if limit <= 0 {
		limit = 300 * time.Second
	}
	if n <= 1 {
		return 0
	}
	d := 10 * time.Second
	for i := int32(2); i < n && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}

// shouldRestart is Kubernetes' ContainerShouldRestart for a container that exited with code:
// its restart rules in order (the first whose exit codes match decides), then the
// container's restart policy, then the pod's.
func shouldRestart(pod *corev1.Pod, c *corev1.Container, code int) bool {
	for _, rule := range c.RestartPolicyRules {
		if rule.ExitCodes == nil {
			continue
		}
		in := slices.Contains(rule.ExitCodes.Values, int32(code))
		if (rule.ExitCodes.Operator == corev1.ContainerRestartRuleOnExitCodesOpIn) == in {
			return rule.Action == corev1.ContainerRestartRuleActionRestart || rule.Action == corev1.ContainerRestartRuleActionRestartAllContainers
		}
	}
	return policyRestarts(pod, c, code)
}

// policyRestarts is the container's (or else the pod's) restart policy's verdict on an exit.
func policyRestarts(pod *corev1.Pod, c *corev1.Container, code int) bool {
	policy := corev1.ContainerRestartPolicy(pod.Spec.RestartPolicy)
	if c.RestartPolicy != nil {
		policy = *c.RestartPolicy
	}
	switch policy {
	case corev1.ContainerRestartPolicyAlways:
		return true
	case corev1.ContainerRestartPolicyOnFailure:
		return code != 0
	}
	return false
}

// startProbes runs the container's liveness and readiness probes until ctx ends (the
// process exits): a failed liveness probe kills the process, and its restart rules decide.
func (a *Agent) startProbes(ctx context.Context, key string, pod *corev1.Pod, r *run) {
	if p := r.container.LivenessProbe; p != nil {
		go a.probe(ctx, key, r, p, func(ok bool) bool {
			if !ok {
				a.mu.Lock()
				r.probeKilled = true
				a.mu.Unlock()
				a.kill(r, pod)
			}
			return !ok
		})
	}
	if p := r.container.ReadinessProbe; p != nil {
		go a.probe(ctx, key, r, p, func(ok bool) bool {
			a.mu.Lock()
			changed := ok != r.ready
			r.ready = ok
			a.mu.Unlock()
			if changed {
				if err := a.running(ctx, pod, r); err != nil && ctx.Err() == nil {
					a.opts.Logf("nodeagent: %s: reporting readiness: %v", key, err)
				}
			}
			return false
		})
	}
}

// waiting reports the container waiting to restart; the pod stays Running and not ready.
func (a *Agent) waiting(ctx context.Context, pod *corev1.Pod, r *run, reason, message string) error {
	a.mu.Lock()
	restarts, last := r.restarts, r.lastState
	a.mu.Unlock()
	now := metav1.Now()
	return a.updateStatus(ctx, pod, func(st *corev1.PodStatus) {
		if st.Phase == corev1.PodSucceeded || st.Phase == corev1.PodFailed {
			return
		}
		st.Conditions = conditions(corev1.ConditionFalse, now)
		st.ContainerStatuses = []corev1.ContainerStatus{{
			Name: r.container.Name, Image: r.container.Image, ImageID: "nodeagent://" + r.container.Image, Started: ptr.To(false),
			State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: message}},
			LastTerminationState: last, RestartCount: restarts,
		}}
	})
}

// running reports the pod Running at its address.
func (a *Agent) running(ctx context.Context, pod *corev1.Pod, r *run) error {
	a.mu.Lock()
	started, ready, pid, restarts, last := r.started, r.ready, r.cmd.Process.Pid, r.restarts, r.lastState
	a.mu.Unlock()
	return a.updateStatus(ctx, pod, func(st *corev1.PodStatus) {
		if st.Phase == corev1.PodSucceeded || st.Phase == corev1.PodFailed {
			return // a late readiness report must not revive an exited pod
		}
		now := metav1.NewTime(started)
		st.Phase = corev1.PodRunning
		st.HostIP, st.PodIP = "127.0.0.1", statusIP(r.ip)
		st.HostIPs, st.PodIPs = []corev1.HostIP{{IP: "127.0.0.1"}}, []corev1.PodIP{{IP: statusIP(r.ip)}}
		if st.StartTime == nil {
			st.StartTime = &now // the pod's start: a restarted process keeps it
		}
		condition := corev1.ConditionFalse
		if ready {
			condition = corev1.ConditionTrue
		}
		st.Conditions = conditions(condition, now)
		st.ContainerStatuses = []corev1.ContainerStatus{{
			Name: r.container.Name, Image: r.container.Image, ImageID: "nodeagent://" + r.container.Image, ContainerID: fmt.Sprintf("nodeagent://%d", pid),
			Ready: ready, Started: ptr.To(true), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(started)}},
			LastTerminationState: last, RestartCount: restarts,
		}}
	})
}

// finish reports the pod's container terminated (r nil: it never started).
func (a *Agent) finish(ctx context.Context, pod *corev1.Pod, r *run, code int, reason, message string) error {
	now := metav1.Now()
	return a.updateStatus(ctx, pod, func(st *corev1.PodStatus) {
		st.Phase = corev1.PodFailed
		if code == 0 {
			st.Phase = corev1.PodSucceeded
		}
		started := now
		if r != nil {
			started = metav1.NewTime(r.started)
		}
		if st.StartTime == nil {
			st.StartTime = &started
		}
		st.Conditions = conditions(corev1.ConditionFalse, now)
		name, image := pod.Spec.Containers[0].Name, pod.Spec.Containers[0].Image
		var restarts int32
		var last corev1.ContainerState
		if r != nil {
			a.mu.Lock()
			restarts, last = r.restarts, r.lastState
			a.mu.Unlock()
		}
		st.ContainerStatuses = []corev1.ContainerStatus{{
			Name: name, Image: image, ImageID: "nodeagent://" + image, Started: ptr.To(false),
			RestartCount: restarts, LastTerminationState: last,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: int32(code), Reason: reason, Message: message, StartedAt: started, FinishedAt: now,
			}},
		}}
	})
}

func conditions(ready corev1.ConditionStatus, at metav1.Time) []corev1.PodCondition {
	out := []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: at},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: at}}
	for _, t := range []corev1.PodConditionType{corev1.ContainersReady, corev1.PodReady} {
		out = append(out, corev1.PodCondition{Type: t, Status: ready, LastTransitionTime: at})
	}
	return out
}

func (a *Agent) updateStatus(ctx context.Context, pod *corev1.Pod, mutate func(*corev1.PodStatus)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := a.opts.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil // force-deleted: nobody is left to tell
		}
		if err != nil {
			return err
		}
		if p.UID != pod.UID {
			return nil
		}
		mutate(&p.Status)
		_, err = a.opts.Client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{FieldManager: FieldManager})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
}

// probe runs an exec or httpGet probe every period and hands each verdict to act once it
// holds (failureThreshold failures or successThreshold successes in a row); act returns true
// to stop probing.
func (a *Agent) probe(ctx context.Context, key string, r *run, p *corev1.Probe, act func(ok bool) bool) {
	period := time.Duration(max(p.PeriodSeconds, 1)) * time.Second
	timeout := time.Duration(max(p.TimeoutSeconds, 1)) * time.Second
	failThreshold, okThreshold := max(p.FailureThreshold, 1), max(p.SuccessThreshold, 1)
	select {
	case <-ctx.Done():
		return
	case <-time.After(time.Duration(p.InitialDelaySeconds) * time.Second):
	}
	var fails, oks int32
	for {
		if a.isDown(r.node) {
			return // a dead kubelet probes nothing
		}
		err := a.probeOnce(ctx, r, p, timeout)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			fails, oks = fails+1, 0
			a.opts.Logf("nodeagent: %s probe failed (%d/%d): %v", key, fails, failThreshold, err)
		} else {
			fails, oks = 0, oks+1
		}
		if (fails >= failThreshold && act(false)) || (oks >= okThreshold && act(true)) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(period):
		}
	}
}

// probeOnce runs the probe's handler once: an exec command with paths rewritten, or an HTTP
// GET to the pod's own address (2xx and 3xx pass, as for a kubelet).
func (a *Agent) probeOnce(ctx context.Context, r *run, p *corev1.Probe, timeout time.Duration) error {
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch {
	case p.Exec != nil:
		argv := make([]string, len(p.Exec.Command))
		for i, s := range p.Exec.Command {
			argv[i] = rewrite(s, r.paths)
		}
		cmd := exec.CommandContext(pctx, argv[0], argv[1:]...)
		cmd.Env, cmd.Dir = r.env, r.dir
		return cmd.Run()
	case p.HTTPGet != nil:
		port, err := containerPort(&r.container, p.HTTPGet.Port)
		if err != nil {
			return err
		}
		host := cmp.Or(p.HTTPGet.Host, r.ip)
		scheme := strings.ToLower(string(cmp.Or(p.HTTPGet.Scheme, corev1.URISchemeHTTP)))
		req, err := http.NewRequestWithContext(pctx, http.MethodGet,
			fmt.Sprintf("%s://%s%s", scheme, net.JoinHostPort(host, strconv.Itoa(port)), p.HTTPGet.Path), nil)
		if err != nil {
			return err
		}
		for _, h := range p.HTTPGet.HTTPHeaders {
			req.Header.Add(h.Name, h.Value)
		}
		resp, err := probeClient.Do(req)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return fmt.Errorf("HTTP %d from %s", resp.StatusCode, req.URL)
		}
		return nil
	default:
		return errors.New("nodeagent runs exec and httpGet probes only")
	}
}

// probeClient skips certificate checks, as the kubelet's HTTPS probes do.
var probeClient = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a kubelet's probes do not verify

// containerPort resolves a probe's port, by number or by the container port's name.
func containerPort(c *corev1.Container, port intstr.IntOrString) (int, error) {
	if port.Type == intstr.Int {
		return port.IntValue(), nil
	}
	for _, p := range c.Ports {
		if p.Name == port.StrVal {
			return int(p.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("no container port named %q", port.StrVal)
}

// terminationGrace is the pod's termination grace period (30 s unset, as the API defaults it).
func terminationGrace(pod *corev1.Pod) time.Duration {
	return time.Duration(ptr.Deref(pod.Spec.TerminationGracePeriodSeconds, 30)) * time.Second
}

// kill is the kubelet's answer to a failed liveness probe: SIGTERM, grace period, SIGKILL of
// the current process; its restart rules then decide whether it runs again.
func (a *Agent) kill(r *run, pod *corev1.Pod) {
	grace := terminationGrace(pod)
	a.mu.Lock()
	cmd, inst := r.cmd, r.instance
	a.mu.Unlock()
	pgid := -cmd.Process.Pid
	_ = syscall.Kill(pgid, syscall.SIGTERM)
	select {
	case <-inst:
		return
	case <-time.After(grace):
	}
	_ = signalContainer(cmd.Process.Pid, syscall.SIGKILL)
	<-inst
}

// serviceAccountKubeconfig writes a kubeconfig holding a token bound to the pod for its
// service account, unless the pod or its account opts out of the token (or the agent has no
// Config). It returns the file's path, "" for none.
func (a *Agent) serviceAccountKubeconfig(ctx context.Context, pod *corev1.Pod, dir string) (string, error) {
	if a.opts.Config == nil {
		return "", nil
	}
	name := cmp.Or(pod.Spec.ServiceAccountName, "default")
	sa, err := a.opts.Client.CoreV1().ServiceAccounts(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("service account %s/%s: %w", pod.Namespace, name, err)
	}
	mount := pod.Spec.AutomountServiceAccountToken
	if mount == nil {
		mount = sa.AutomountServiceAccountToken
	}
	if mount != nil && !*mount {
		return "", nil
	}
	tr, err := a.opts.Client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To[int64](3600),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for %s/%s: %w", pod.Namespace, name, err)
	}
	ca := a.opts.Config.CAData
	if len(ca) == 0 && a.opts.Config.CAFile != "" {
		if ca, err = os.ReadFile(a.opts.Config.CAFile); err != nil {
			return "", err
		}
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["cluster"] = &clientcmdapi.Cluster{Server: a.opts.Config.Host, CertificateAuthorityData: ca}
	cfg.AuthInfos["pod"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts["pod"] = &clientcmdapi.Context{Cluster: "cluster", AuthInfo: "pod", Namespace: pod.Namespace}
	cfg.CurrentContext = "pod"
	path := filepath.Join(dir, "kubeconfig")
	return path, clientcmd.WriteToFile(*cfg, path)
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		if err != nil {
			return 1
		}
		return 0
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ee.ExitCode()
}

// readTail is the last n bytes of a file, as the kubelet reads a termination message.
func readTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer func() { _ = f.Close() }()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		if _, err := f.Seek(st.Size()-n, io.SeekStart); err != nil {
			return ""
		}
	}
	b, _ := io.ReadAll(io.LimitReader(f, n))
	return string(b)
}

// logTail is the end of a container's log as FallbackToLogsOnError takes it: at most
// maxBytes and maxLines lines, whichever is smaller.
func logTail(path string, maxBytes int64, maxLines int) string {
	s := readTail(path, maxBytes)
	lines := strings.SplitAfter(s, "\n")
	if len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if len(lines) > maxLines {
		lines = lines[len(lines)-maxLines:]
	}
	return strings.Join(lines, "")
}

// mapping stands a container path for a host path.
type mapping struct{ from, to string }

// volumes makes the host folders of the pod's volumes and returns the path mappings, longest
// container path first.
func (a *Agent) volumes(pod *corev1.Pod, c *corev1.Container, dir string) ([]mapping, error) {
	byName := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		byName[v.Name] = v
	}
	var out []mapping
	for _, m := range c.VolumeMounts {
		v := byName[m.Name]
		host := filepath.Join(dir, "volumes", m.Name)
		if v.PersistentVolumeClaim != nil {
			host = filepath.Join(a.opts.WorkDir, "volumes", pod.Namespace, v.PersistentVolumeClaim.ClaimName)
		}
		if err := os.MkdirAll(host, 0o755); err != nil {
			return nil, err
		}
		if v.ConfigMap != nil {
			if err := a.writeConfigMap(pod.Namespace, v.ConfigMap, host); err != nil {
				return nil, err
			}
		}
		if m.SubPath != "" {
			host = filepath.Join(host, m.SubPath)
			if v.ConfigMap == nil {
				if err := os.MkdirAll(host, 0o755); err != nil {
					return nil, err
				}
			}
		}
		out = append(out, mapping{from: m.MountPath, to: host})
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	term := c.TerminationMessagePath
	if term == "" {
		term = corev1.TerminationMessagePathDefault
	}
	out = append(out, mapping{from: term, to: filepath.Join(dir, "termination-log")})
	sort.Slice(out, func(i, j int) bool { return len(out[i].from) > len(out[j].from) })
	return out, nil
}

// writeConfigMap fills dir with the ConfigMap's keys as files, as the kubelet's configMap
// volume does (its items, or every key; its modes). A missing ConfigMap fails the start
// unless the volume is optional.
func (a *Agent) writeConfigMap(ns string, src *corev1.ConfigMapVolumeSource, dir string) error {
	cm, err := a.opts.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), src.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && ptr.Deref(src.Optional, false) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("configMap volume %s: %w", src.Name, err)
	}
	files := map[string][]byte{}
	for k, v := range cm.Data {
		files[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		files[k] = v
	}
	type file struct {
		key, path string
		mode      int32
	}
	mode := ptr.Deref(src.DefaultMode, corev1.ConfigMapVolumeSourceDefaultMode)
	var out []file
	if len(src.Items) == 0 {
		for k := range files {
			out = append(out, file{k, k, mode})
		}
	}
	for _, it := range src.Items {
		if _, ok := files[it.Key]; !ok {
			return fmt.Errorf("configMap volume %s: no key %q", src.Name, it.Key)
		}
		out = append(out, file{it.Key, it.Path, ptr.Deref(it.Mode, mode)})
	}
	for _, f := range out {
		path := filepath.Join(dir, filepath.Clean("/"+f.path))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, files[f.key], os.FileMode(f.mode)&0o777); err != nil {
			return err
		}
	}
	return nil
}

func terminationPath(c *corev1.Container, paths []mapping) string {
	term := c.TerminationMessagePath
	if term == "" {
		term = corev1.TerminationMessagePathDefault
	}
	return rewrite(term, paths)
}

// rewrite replaces container paths in s by their host folders (a path must end at a
// separator or the end of a word to match).
func rewrite(s string, paths []mapping) string {
	for _, m := range paths {
		var b strings.Builder
		rest := s
		for {
			i := strings.Index(rest, m.from)
			if i < 0 {
				b.WriteString(rest)
				break
			}
			end := i + len(m.from)
			boundary := end == len(rest) || !isPathChar(rest[end]) || rest[end] == '/'
			start := i == 0 || !isPathChar(rest[i-1])
			b.WriteString(rest[:i])
			if boundary && start {
				b.WriteString(m.to)
			} else {
				b.WriteString(m.from)
			}
			rest = rest[end:]
		}
		s = b.String()
	}
	return s
}

func isPathChar(c byte) bool {
	return c == '/' || c == '-' || c == '_' || c == '.' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// environment is the process's env: the container's variables in order with $(VAR) expanded
// and downward-API fields filled, paths rewritten and pod DNS names resolved. unresolved
// names a peer that has no address yet.
func (a *Agent) environment(pod *corev1.Pod, c *corev1.Container, ip string, paths []mapping) (env []string, unresolved string) {
	env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + filepath.Join(a.opts.WorkDir, "pods"), "HOSTNAME=" + hostnameOf(pod)}
	lookup := func(name string) (string, bool) { return envValue(env, name) }
	for _, e := range c.Env {
		v := expand(e.Value, lookup)
		if f := e.ValueFrom; f != nil && f.FieldRef != nil {
			v = field(pod, f.FieldRef.FieldPath, ip)
		}
		if m := podDNS.FindStringSubmatch(v); m != nil {
			addr := a.resolve(pod, ip, m[5], m[1], m[3])
			if addr == "" {
				return nil, v
			}
			if a.opts.HostsFile == "" {
				v = addr
			} else if self := pod.Spec.Hostname == m[1] && pod.Spec.Subdomain == m[3]; !self {
				// The name, as a kubelet passes it, once the hosts file has it. A pod's
				// own name is not published until it runs: its address is given.
				a.syncHosts()
			} else {
				v = addr
			}
		}
		env = append(env, e.Name+"="+rewrite(v, paths))
	}
	return env, ""
}

func hostnameOf(pod *corev1.Pod) string {
	if pod.Spec.Hostname != "" {
		return pod.Spec.Hostname
	}
	return pod.Name
}

func field(pod *corev1.Pod, path, ip string) string {
	switch path {
	case "metadata.name":
		return pod.Name
	case "metadata.namespace":
		return pod.Namespace
	case "metadata.uid":
		return string(pod.UID)
	case "spec.nodeName":
		return pod.Spec.NodeName
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName
	case "status.podIP":
		return ip
	case "status.hostIP":
		return "127.0.0.1"
	}
	for _, pre := range []struct {
		prefix string
		m      map[string]string
	}{{"metadata.labels['", pod.Labels}, {"metadata.annotations['", pod.Annotations}} {
		if k, ok := strings.CutPrefix(path, pre.prefix); ok {
			return pre.m[strings.TrimSuffix(k, "']")]
		}
	}
	return ""
}

func envValue(env []string, name string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, _ := strings.Cut(env[i], "="); k == name {
			return v, true
		}
	}
	return "", false
}

// expand is Kubernetes' $(VAR) expansion: defined names are replaced, $$ escapes, anything
// else is left as written.
func expand(s string, lookup func(string) (string, bool)) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+end+1])
			}
			i += end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// Signal sends sig to the process of pod ns/name (SIGKILL: a crash; SIGSTOP: a hang).
func (a *Agent) Signal(ns, name string, sig syscall.Signal) error {
	a.mu.Lock()
	r := a.runs[ns+"/"+name]
	var cmd *exec.Cmd
	if r != nil {
		cmd = r.cmd
	}
	a.mu.Unlock()
	if cmd == nil || r.exitedNow() {
		return fmt.Errorf("nodeagent: pod %s/%s has no running process", ns, name)
	}
	return signalContainer(cmd.Process.Pid, sig)
}

// NodeDown kills the node's kubelet: its processes die with it (SIGKILL: a power loss), its
// heartbeats stop and its pods are never cleaned up (they stay Terminating once deleted). The
// node still looks Ready for NodeMonitorGracePeriod, as on a real cluster (kind showed it: the
// node lifecycle controller marks it after its grace period; until then only its lapsed Lease
// tells), then turns NotReady.
func (a *Agent) NodeDown(_ context.Context, node string) error {
	a.mu.Lock()
	a.down[node] = true
	var runs []*run
	for _, r := range a.runs {
		if r.node == node {
			runs = append(runs, r)
		}
	}
	a.mu.Unlock()
	for _, r := range runs {
		a.stop(r, 0)
	}
	grace := a.opts.NodeMonitorGracePeriod
	if grace <= 0 {
		grace = 30 * time.Second
	}
	go func() {
		select {
		case <-a.life.Done():
		case <-time.After(grace):
			if err := a.markNotReady(a.life, node); err != nil && a.life.Err() == nil {
				a.opts.Logf("nodeagent: marking %s NotReady: %v", node, err)
			}
		}
	}()
	return nil
}

// markNotReady is the node lifecycle controller's verdict on a node whose kubelet went silent.
func (a *Agent) markNotReady(ctx context.Context, node string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := a.opts.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		for i := range n.Status.Conditions {
			if n.Status.Conditions[i].Type == corev1.NodeReady {
				n.Status.Conditions[i] = corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionUnknown,
					Reason: "NodeStatusUnknown", Message: "Kubelet stopped posting node status.", LastHeartbeatTime: n.Status.Conditions[i].LastHeartbeatTime, LastTransitionTime: now}
			}
		}
		_, err = a.opts.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{FieldManager: FieldManager})
		return err
	})
}

// Freeze stops the node the way a hung host stops: its kubelet posts no status and renews
// no Lease any more, does nothing for its pods (deleted ones stay Terminating, a force-deleted
// one's process is left as it is) and its processes are frozen (SIGSTOP), so their sockets
// stay open and peers learn nothing from TCP. Nothing marks the node NotReady: that is left
// to whatever watches its Lease. The processes are killed when the agent stops, or go on
// when the node comes back (Thaw).
func (a *Agent) Freeze(node string) error {
	a.mu.Lock()
	a.down[node] = true
	var cmds []*exec.Cmd
	for _, r := range a.runs {
		if r.node == node && r.cmd != nil && r.cmd.Process != nil && !r.exitedNow() {
			cmds = append(cmds, r.cmd)
		}
	}
	a.mu.Unlock()
	var errs []error
	for _, c := range cmds {
		if err := signalContainer(c.Process.Pid, syscall.SIGSTOP); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Thaw brings a frozen node back, as a hung host that recovers: its processes run on from
// where they stopped, its kubelet posts status and renews its Lease again and learns what
// became of its pods meanwhile. The process of a pod deleted or replaced while the node was
// frozen runs until the kubelet's next relist, then is stopped as a kubelet stops a pod gone
// from the API: SIGTERM, SIGKILL after the pod's grace period.
func (a *Agent) Thaw(node string) error {
	a.mu.Lock()
	delete(a.down, node)
	var resumed, gone []*run
	var keys []string
	for key, r := range a.runs {
		if r.node == node {
			resumed, keys = append(resumed, r), append(keys, key)
		}
	}
	for _, r := range a.orphans {
		if r.node == node {
			resumed, gone = append(resumed, r), append(gone, r)
		}
	}
	a.mu.Unlock()
	var errs []error
	for _, r := range resumed {
		if r.cmd != nil && r.cmd.Process != nil && !r.exitedNow() {
			if err := signalContainer(r.cmd.Process.Pid, syscall.SIGCONT); err != nil && !errors.Is(err, syscall.ESRCH) {
				errs = append(errs, err)
			}
		}
	}
	for _, key := range keys {
		a.queue.Add(key) // a pod deleted meanwhile: NotFound stops its process
	}
	for _, r := range gone {
		go func() {
			a.awaitRelist(a.life)
			a.stop(r, r.grace)
			a.mu.Lock()
			a.orphans = slices.DeleteFunc(a.orphans, func(o *run) bool { return o == r })
			a.mu.Unlock()
		}()
	}
	return errors.Join(errs...)
}

// Processes are the UIDs of the pods whose processes run on node, a frozen node's stopped
// ones and those of pods replaced while it was frozen included.
func (a *Agent) Processes(node string) []types.UID {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []types.UID
	for _, r := range append(slices.Collect(maps.Values(a.runs)), a.orphans...) {
		if r.node == node && !r.exitedNow() {
			out = append(out, r.uid)
		}
	}
	return out
}

func (a *Agent) isDown(node string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.down[node]
}

// SetGPUAllocatable lowers (or restores) a node's allocatable amd.com/gpu, as the AMD device
// plugin does when a GPU turns unhealthy.
func (a *Agent) SetGPUAllocatable(ctx context.Context, node string, n int64) error {
	a.mu.Lock()
	a.gpus[node] = n
	a.mu.Unlock()
	return a.postStatus(ctx, node)
}

// RunLogPath is where the run of a container after restarts in-place restarts logs: next to
// the container's whole log (<container>.log) as <container>.<restarts>.log.
func RunLogPath(containerLog string, restarts int32) string {
	return fmt.Sprintf("%s.%d.log", strings.TrimSuffix(containerLog, ".log"), restarts)
}

// PodDir is the host folder of a pod the agent ran, even after the pod is gone ("" if none):
// its container's log (<container>.log, each run's in <container>.<restarts>.log),
// termination-log and emptyDir volumes.
func (a *Agent) PodDir(ns, name string) string {
	a.mu.Lock()
	r := a.runs[ns+"/"+name]
	a.mu.Unlock()
	if r != nil {
		return r.dir // the pod of that name that runs now, not one it replaced
	}
	dirs, _ := filepath.Glob(filepath.Join(a.opts.WorkDir, "pods", fmt.Sprintf("%s_%s_*", ns, name)))
	newest, at := "", time.Time{}
	for _, d := range dirs {
		if st, err := os.Stat(d); err == nil && st.ModTime().After(at) {
			newest, at = d, st.ModTime()
		}
	}
	return newest
}

// WorkDir is the agent's folder: pods/<ns>_<pod>_<uid>/ and volumes/.
func (a *Agent) WorkDir() string { return a.opts.WorkDir }

// VolumeDir is the host folder standing for claim in ns.
func (a *Agent) VolumeDir(ns, claim string) string {
	return filepath.Join(a.opts.WorkDir, "volumes", ns, claim)
}

// NodeOf is the node a running pod is on ("" if none).
func (a *Agent) NodeOf(ns, name string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r := a.runs[ns+"/"+name]; r != nil {
		return r.node
	}
	return ""
}

// Nodes are the names of the nodes the agent plays.
func (a *Agent) Nodes() []string { return append([]string(nil), a.opts.Nodes...) }
