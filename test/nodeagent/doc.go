// Package nodeagent plays kubelet for test nodes on a machine with no container runtime: it
// registers Node objects that look like MI300X workers, keeps their Ready condition and Lease
// fresh, and runs every pod bound to them as a local process (the container's command and
// args, its environment resolved, volumes mapped to host folders, each pod on its own
// 127.1.x.y address, reported as 10.244.x.y because the API refuses loopback
// endpoints), reporting phase, exit code and termination message, honouring deletion
// (SIGTERM, grace period, SIGKILL), running exec and httpGet probes (liveness kills,
// readiness gates the Ready condition), restarting a container in place when its restart
// rules or restart policy say so (Kubernetes 1.36's ContainerRestartRules: rules in order,
// then the container's policy, then the pod's; same address and folder, pod DNS names
// looked up again, restartCount and
// lastState with the exit code and termination message, each run a fresh termination log,
// the kubelet's crash-loop back-off capped by Options.MaxContainerRestartPeriod), and
// handing pods that mount a service-account token
// a token bound to the pod (Options.Config), so an operator installed by Helm runs under its
// own RBAC.
//
// It is its nodes' only kubelet: they never carry KwokNodeAnnotation, so the local cluster's
// kwok (hack/cluster.sh) leaves them, their Leases and their pods alone; pods are Ready only
// once their process passes its readiness probe, and a deleted pod's process gets its full
// grace period. Every write the agent makes is recorded under FieldManager.
//
// Init containers run first, in order, each to its end (restartPolicy Never: a failed one
// fails the pod; otherwise it is tried again 10 s later), reported in initContainerStatuses.
//
// Where it differs from a kubelet: a RestartAllContainers rule restarts the one container
// like Restart (pods have exactly one) and the back-off is never reset by a long run; init
// containers run in the agent's sync loop (at most 2 minutes each), again whenever the
// container's start is retried;
// processes share the host's filesystem, so the agent
// rewrites every path under a volume mount, /dev/shm or the termination-message path in the
// container's env, command, args and probe commands to the host folder that stands for it;
// and there is no cluster DNS, so env values naming a pod as <hostname>.<subdomain>.<ns>.svc
// are replaced by that pod's address (the process starts once the name resolves); the token
// comes as a kubeconfig named by KUBECONFIG instead of files under
// /var/run/secrets/kubernetes.io/serviceaccount. The images are ignored: command[0] is
// looked up in Options.Commands, by its whole name and then its base name, unless it is a
// file in one of the pod's own volumes, which runs as itself (an init container put it
// there). Pods share the host's network: a port bound on all addresses is bound once for
// every pod (zaya-supervisor's hub and progress ports: pass it the pod's own address).
//
// Fault knobs for tests: Signal (kill or stop a pod's process), NodeDown (the kubelet dies:
// processes die, heartbeats stop, the node turns NotReady at once instead of after the
// node-monitor grace period, and its pods stay Terminating), Freeze (the host hangs: its
// processes are stopped with their sockets open, its Lease is no longer renewed, and nothing
// marks it NotReady), SetGPUAllocatable (a GPU goes unhealthy). Node Leases last 20 s (a
// kubelet's 40 s, renewed as often relative to it), so a lapse shows in seconds. Never shipped: it exists for the e2e tests and make demo.
package nodeagent
