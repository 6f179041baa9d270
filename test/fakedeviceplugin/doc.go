// Package fakedeviceplugin is a kubelet device plugin (API v1beta1) that makes a kind worker
// look like an AMD MI300X node with AMD's GPU and network operators installed, on a machine
// with no AMD hardware. It exists so that the operator's end-to-end tests go through the real
// kubelet paths: the scheduler places pods on amd.com/gpu and amd.com/nic, the kubelet's
// device manager allocates devices and admits or refuses pods, and a device going unhealthy
// lowers the node's allocatable (not its capacity) exactly as AMD's plugins make it do.
//
// # Resources and devices
//
// One plugin per resource, each on its own socket in the kubelet's device-plugin directory:
//
//	amd.com/gpu  socket amd-gpu-fake.sock  devices gpu-0 … gpu-<N-1>
//	amd.com/nic  socket amd-nic-fake.sock  devices nic-0 … nic-<N-1>
//
// Device IDs are "<kind>-<index>" rather than PCI addresses (what AMD's plugin uses): they are
// stable across restarts, say which device they are, and match the control-file names below.
// A plugin registers with kubelet.sock and registers again whenever the kubelet restarts: the
// kubelet then deletes every socket in the directory (the plugin's own disappearing makes it
// serve a new one) and re-creates kubelet.sock (its creation makes the plugin register again).
// The directory is watched with inotify and, in case an event is missed, the plugin's socket
// is also checked every resync period.
//
// # Health control
//
// The control directory (default /var/lib/kubelet/device-plugins/amd-fake-control, on the
// same hostPath, so `docker exec <node> touch …` works as well as `kubectl exec`) holds one
// empty file per unhealthy device:
//
//	unhealthy-gpu-3   amd.com/gpu device gpu-3 is Unhealthy
//	unhealthy-nic-0   amd.com/nic device nic-0 is Unhealthy
//
// Removing the file makes the device Healthy again. The directory is read whole on every
// change (and every resync period), so the files present are the state, whatever events were
// seen. Any other name (unknown kind, index out of range, leading zeros, a sign) is logged once
// and ignored. Each health change is sent on every open ListAndWatch stream, so the kubelet
// lowers or restores allocatable; running pods are not touched (AMD's plugin does not evict
// them either).
//
// # What Allocate sets
//
// AMD's k8s-device-plugin answers Allocate with device specs only: /dev/kfd once plus each
// allocated GPU's /dev/dri/card<N> and /dev/dri/renderD<M>; the container sees only those
// GPUs. A kind node has none of these device nodes and the runtime would refuse to start the
// container over a missing one, so device specs are opt-in (-device-specs, default off).
// What is always set, as environment, so that a workload or a test can see what it was given:
//
//	AMD_FAKE_DEVICE_PLUGIN=1                  both resources: the devices are fakes
//	HIP_VISIBLE_DEVICES=1,3                   amd.com/gpu: allocated indices, ascending
//	ROCR_VISIBLE_DEVICES=1,3                  amd.com/gpu: the same, for the ROCr runtime
//	ZAYA_FAKE_NICS=ionic_1,ionic_3            amd.com/nic: the RDMA device names of the
//	                                          allocated NICs (as NCCL_IB_HCA names them)
//
// The two *_VISIBLE_DEVICES variables are what ROCm reads to restrict the GPUs a process uses;
// AMD's plugin does not set them. They are harmless here, where no GPU exists, and they make
// the allocation observable. With -device-specs, a GPU allocation also gets /dev/kfd,
// /dev/dri/card<i> and /dev/dri/renderD<128+i>, a NIC allocation /dev/infiniband/rdma_cm and
// /dev/infiniband/uverbs<i> (all "rw"); use it only where those nodes exist.
//
// GetPreferredAllocation prefers the devices the kubelet must include, then the lowest free
// indices, so allocations are deterministic (and GPU i lines up with NIC i on a full node).
//
// # Node labels
//
// With -label-node the binary merge-patches its own Node (from NODE_NAME) once at start with
// the labels AMD's node labeller and Node Feature Discovery put on an MI300X node, the same
// keys and values as the kwok nodes of hack/cluster/mi300x-node.yaml (see NodeLabels). It
// needs get and patch on nodes, nothing else.
package fakedeviceplugin
