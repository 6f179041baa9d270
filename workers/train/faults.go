package train

import (
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
)

// Fault injection for chaos tests (Config.FaultFile): a fault is played as the real one ends a
// training process, so that what the operator reads (the exit, the log's last words through
// terminationMessagePolicy FallbackToLogsOnError) is what it would read on a cluster. The lines
// are the ones ROCm, RCCL and the Go runtime print (controllers/attribution/defaults.yaml).

// injectFault ends the process as the fault named in path says, if any; it removes the file.
// It returns true for "slow": from then on the node's ranks take twice as long per step (at
// least 20 ms more), as a straggler would (a throttled GPU, a noisy neighbour).
func injectFault(path string, log io.Writer, nodeRank int, step int64) (slow bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	fault := strings.TrimSpace(string(b))
	if fault == "" {
		// Created but not yet written (a test's WriteFile or `echo >` between its truncate
		// and its write): taking it now would drop the fault for good. The next step reads it.
		return false
	}
	_ = os.Remove(path)
	switch fault {
	case "gpu":
		// ROCR's message, then its abort().
		_, _ = fmt.Fprintf(os.Stderr, "Memory access fault by GPU node-%d (Agent handle: 0x5a4f1c3e2b00) on address 0x7f2b3c001000. Reason: Page not present or supervisor privilege.\n", nodeRank+2)
		abort()
	case "nic":
		// RCCL's IB transport, then the process tears down (TORCH_NCCL_ASYNC_ERROR_HANDLING).
		_, _ = fmt.Fprintf(os.Stderr, "NCCL WARN NET/IB : Got completion from peer 10.10.3.7<45678> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.10.3.5\n")
		_, _ = fmt.Fprintf(os.Stderr, "NCCL WARN NET/IB : transport retry counter exceeded\n")
		abort()
	case "usercode":
		// A Go program's own bug: its panic line and (the start of) its trace, exit 2.
		_, _ = fmt.Fprintf(os.Stderr, "panic: runtime error: index out of range [%d] with length %d\n\ngoroutine 1 [running]:\nmain.loadBatch(...)\n\t/src/train/data.go:88\n", step, step)
		os.Exit(2)
	case "slow":
		_, _ = fmt.Fprintf(log, "fault: node %d slowed down from step %d\n", nodeRank, step)
		return true
	default:
		_, _ = fmt.Fprintf(log, "fault file %s names no fault (gpu, nic, usercode, slow)\n", path)
	}
	return false
}

// abort ends the process as C's abort() does, as the kubelet reports it: exit 134 (128 +
// SIGABRT). Go's own SIGABRT handler would dump every goroutine over the evidence.
func abort() { os.Exit(128 + int(syscall.SIGABRT)) }
