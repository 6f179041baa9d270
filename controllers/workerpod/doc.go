// Package workerpod owns what a job's ranks run in: the worker pod rendered from the spec
// (the worker contract's environment, the network profile's RCCL environment, the heartbeat
// probe, Pod Security defaults, the supervisor's injection), the headless Service and the
// checkpoint claim, their names and labels, and the node rules other concerns place on a pod.
// Everything here is a pure function of the job; concerns that add to a pod (admission's pod
// group, the restart mechanism, quarantine, spares) do so through a Decoration, and the
// package imports none of them.
package workerpod
