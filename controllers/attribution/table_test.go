package attribution

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// corpus is failure output as the components print it (the sources are in defaults.yaml),
// with the category the shipped table must name, and lines it must not take for a fault.
var corpus = []struct {
	name string
	text string
	want Category // "" : no match
}{
	// GPU hardware.
	{"rocr memory access fault", "Memory access fault by GPU node-2 (Agent handle: 0x55f4c3a1e2b0) on address 0x7f2b3c000000. Reason: Page not present or supervisor privilege.", GPUHardware},
	{"rocr hw exception, gpu hang", "HW Exception by GPU node-3 (Agent handle: 0x5631c8d9a0a0) reason :GPU Hang", GPUHardware},
	{"hsa aperture violation", "terminate called after throwing an instance of 'std::runtime_error'\n  what():  HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION: The agent attempted to access memory beyond the largest legal address. code: 0x29", GPUHardware},
	{"hsa exception", ":0:rocdevice.cpp            :2982: 1234567890 us: [pid:1 tid:0x7f] Device::callbackQueue aborting with error : HSA_STATUS_ERROR_EXCEPTION: An HSAIL operation resulted in a hardware exception. code: 0x1016", GPUHardware},
	{"hip ecc", "RuntimeError: HIP error: hipErrorECCNotCorrectable", GPUHardware},
	{"uncorrectable ecc", "amdgpu 0000:05:00.0: amdgpu: 1 uncorrectable hardware errors detected in umc block", GPUHardware},
	{"gpu reset", "[ 1234.567] amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!", GPUHardware},
	{"ring timeout", "amdgpu 0000:c1:00.0: amdgpu: ring gfx_0.0.0 timeout, signaled seq=1234, emitted seq=1236", GPUHardware},
	{"gpu fault beats its traceback", "Traceback (most recent call last):\n  File \"train.py\", line 10, in <module>\nRuntimeError: HIP error: unspecified launch failure\nMemory access fault by GPU node-4 (Agent handle: 0x1) on address 0x2. Reason: Unknown.", GPUHardware},

	// NIC and fabric.
	{"nccl ib completion status 12", "node-7:1234:5678 [3] NCCL INFO NET/IB : Got completion from peer 10.10.3.7<45678> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.10.3.5 remoteGid ::ffff:10.10.3.7", NICFabric},
	{"nccl ib completion new format", "NCCL WARN NET/IB : Got completion from peer 10.0.0.2<54321> with error 12, opcode 0, len 0, vendor err 129 (Send) localGid fe80::1 remoteGidsfe80::2", NICFabric},
	{"ibv retry exceeded", "ibv_poll_cq: IBV_WC_RETRY_EXC_ERR on QP 0x1a2b", NICFabric},
	{"transport retry", "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error, NCCL version 2.21.5\nncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.\nLast error:\nNET/IB: Got completion from peer 10.1.1.1<1234> with error 12, opcode 0, len 0, vendor err 129: transport retry counter exceeded", NICFabric},
	{"port error", "NCCL WARN NET/IB : Got async event : port error", NICFabric},
	{"link down", "ionic 0000:21:00.0 enp33s0: Link is down", NICFabric},

	// Out of memory.
	{"torch hip oom", "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 191.98 GiB of which 1.20 GiB is free.", OutOfMemory},
	{"torch cuda oom", "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB", OutOfMemory},
	{"hip oom", "hipMalloc failed: hipErrorOutOfMemory", OutOfMemory},
	{"host oom", "MemoryError: Unable to allocate 64.0 GiB for an array", OutOfMemory},
	{"bad alloc", "terminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc", OutOfMemory},
	{"oom beats its traceback", "Traceback (most recent call last):\n  File \"/app/train.py\", line 88, in step\ntorch.OutOfMemoryError: HIP out of memory. Tried to allocate 1.00 GiB.", OutOfMemory},

	// Storage.
	{"enospc", "OSError: [Errno 28] No space left on device: '/checkpoints/step-000000001200/rank-00003.bin'", Storage},
	{"eio", "checkpoint: step 1200: write /checkpoints/step-000000001200/shard-3.bin: input/output error\nOSError: [Errno 5] Input/output error", Storage},
	{"estale", "OSError: [Errno 116] Stale file handle", Storage},
	{"erofs", "open /checkpoints/x: read-only file system\nOSError: [Errno 30] Read-only file system: '/checkpoints/x'", Storage},

	// A peer gone (examples/pytorch, a peer of a SIGKILLed rank).
	{"gloo read reset", "Traceback (most recent call last):\n  File \"/app/train.py\", line 86, in main\n    loss.backward()\nRuntimeError: [./gloo/transport/tcp/pair.cc:589] Read error [127.0.0.1]:26031: Connection reset by peer\nERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 32164) of binary: /usr/bin/python3.11", PeerLost},

	// Collective timeouts.
	{"torch watchdog", "[rank3]:[E1125 10:00:00.000000000 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=123456, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.", CollectiveTimeout},
	{"torch heartbeat monitor", "[rank0]:[E1125 10:10:00.0 ProcessGroupNCCL.cpp:1484] [PG ID 0 PG GUID 0(default_pg) Rank 0] Heartbeat monitor timed out! Process will be terminated after dumping debug info.", CollectiveTimeout},
	{"store timeout", "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 7/8 clients joined.", CollectiveTimeout},
	{"watchdog beats its traceback", "Traceback (most recent call last):\n  File \"train.py\", line 5\nRuntimeError: [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLGATHER) ran for 1800000 milliseconds before timing out.", CollectiveTimeout},

	// PyTorch 1.13 under torchrun, gloo on CPU (examples/pytorch), as printed.
	{"gloo recv timeout", "Traceback (most recent call last):\n  File \"/tmp/pt/t.py\", line 13, in <module>\n    dist.all_reduce(x)\n  File \"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py\", line 1541, in all_reduce\n    work.wait()\nRuntimeError: [./gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 5000ms for recv operation to complete\nWARNING:torch.distributed.elastic.multiprocessing.api:Sending process 7363 closing signal SIGTERM\nERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 7362) of binary: /usr/bin/python3.11", CollectiveTimeout},
	{"gloo closed by a peer that raised", "RuntimeError: [./gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:18325\nERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 7982) of binary: /usr/bin/python3.11", PeerLost},
	{"torchrun's child killed", torchrunFailed("exitcode: -9", "-9 (pid: 7697)", "Signal 9 (SIGKILL) received by PID 7697"), Killed},
	{"torchrun's child raised", "  File \"/tmp/pt/t.py\", line 11, in <module>\n    raise ValueError(\"warmup_steps must be below total_steps\")\nValueError: warmup_steps must be below total_steps\n" + torchrunFailed("exitcode: 1", "1 (pid: 7983)", "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"), UserCode},
	{"torchrun's child segfaulted", torchrunFailed("exitcode: -11", "-11 (pid: 7697)", "Signal 11 (SIGSEGV) received by PID 7697"), UserCode},

	// User code.
	{"module not found", "Traceback (most recent call last):\n  File \"/app/train.py\", line 3, in <module>\n    import flash_attn\nModuleNotFoundError: No module named 'flash_attn'", UserCode},
	{"type error", "Traceback (most recent call last):\n  File \"/app/model.py\", line 120, in forward\nTypeError: forward() missing 1 required positional argument: 'mask'", UserCode},
	{"a program's own exception", "Traceback (most recent call last):\n  File \"/app/train.py\", line 40, in <module>\n    cfg = load(args.config)\nmyproject.config.ConfigurationError: warmup_steps must be below total_steps", UserCode},
	{"key error", "KeyError: 'lr_schedule'", UserCode},
	{"argparse", "usage: train.py [-h] [--lr LR]\ntrain.py: error: unrecognized arguments: --learning-rate 3e-4", UserCode},
	{"go panic", "panic: runtime error: index out of range [8] with length 8\n\ngoroutine 1 [running]:\nmain.main()", UserCode},

	// Negative cases: lines that name no fault.
	{"checkpoint report", "checkpoint-step=1200\ncheckpoint-restored=1000", ""},
	{"stopped by a peer", "zaya: stopped: lost rank 3 during the all-reduce at step 120: EOF", ""},
	{"nccl info lines", "NCCL INFO Bootstrap : Using eth0:10.0.0.5<0>\nNCCL INFO NET/IB : Using [0]ionic_0:1/RoCE [1]ionic_1:1/RoCE ; OOB eth0:10.0.0.5<0>", ""},
	{"link up", "ionic 0000:21:00.0 enp33s0: Link is up at 400 Gbps", ""},
	{"memory words in a log", "step 100: loss 2.31, memory allocated 120.5 GiB, reserved 150.0 GiB", ""},
	{"a value error inside a word", "val_ValueError_count=0", ""},
	{"completion with success", "NET/IB : Got completion from peer 10.0.0.2<1> with status=0 opcode=0", ""},
	{"empty", "", ""},
}

func TestTheShippedTableNamesEachCorpusLine(t *testing.T) {
	table := Default()
	for _, c := range corpus {
		m, ok := table.Match(c.text)
		switch {
		case c.want == "" && ok:
			t.Errorf("%s: matched %s by %s on %q, want no match", c.name, m.Category, m.Pattern, m.Line)
		case c.want != "" && !ok:
			t.Errorf("%s: no match, want %s", c.name, c.want)
		case c.want != "" && m.Category != c.want:
			t.Errorf("%s: %s by %s on %q, want %s", c.name, m.Category, m.Pattern, m.Line, c.want)
		case ok && (m.Pattern == "" || !strings.Contains(c.text, m.Line)):
			t.Errorf("%s: match %+v does not name its rule and line", c.name, m)
		}
	}
}

func TestEveryShippedRuleIsShownByTheCorpus(t *testing.T) {
	used := map[string]bool{}
	for _, c := range corpus {
		if m, ok := Default().Match(c.text); ok {
			used[m.Pattern] = true
		}
	}
	for _, p := range Default().patterns {
		if !used[p.Name] {
			t.Errorf("rule %s matches no corpus line: a rule without a fact behind it", p.Name)
		}
	}
}

func TestABadTableIsRefusedNamingTheRule(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{`[{name: a, category: GPUHardware, regexp: "(unclosed"}]`, `[0] "a": regexp: error parsing regexp`},
		{`[{name: a, category: Cosmic, regexp: x}]`, `[0] "a": category "Cosmic" is not one of`},
		{`[{name: "Bad Name", category: UserCode, regexp: x}]`, `name must be a DNS label`},
		{`[{name: a, category: UserCode, regexp: x}, {name: a, category: UserCode, regexp: y}]`, `[1] "a": name used twice`},
		{`[{name: a, category: UserCode, regexp: ".*"}]`, `matches every line`},
		{`[{name: a, category: UserCode, regexp: ""}]`, `regexp must be 1 to 1024 bytes`},
		{`[{name: a, category: UserCode, regexp: "(a)\\1"}]`, `invalid escape sequence`}, // no backreferences: RE2
		{`{name: a}`, `not a list`},
		{`[{name: a, category: UserCode, regexp: x, severity: high}]`, `unknown field`},
	} {
		if _, err := Parse([]byte(c.yaml)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.yaml, err, c.want)
		}
	}
	var many strings.Builder
	many.WriteString("[")
	for i := range MaxPatterns + 1 {
		if i > 0 {
			many.WriteString(",")
		}
		many.WriteString(`{name: r` + strings.Repeat("x", i%3) + string(rune('a'+i%26)) + `, category: UserCode, regexp: x}`)
	}
	many.WriteString("]")
	if _, err := Parse([]byte(many.String())); err == nil || !strings.Contains(err.Error(), "at most 512") {
		t.Errorf("%d patterns: %v, want refused", MaxPatterns+1, err)
	}
}

func TestAUsersRulesAddToAndReplaceTheShippedOnes(t *testing.T) {
	user, err := Parse([]byte(`
- name: our-dataloader-bug
  category: UserCode
  regexp: 'shard index \d+ out of range'
- name: link-down
  category: NICFabric
  regexp: 'LINK_DOWN_EVENT'
`))
	if err != nil {
		t.Fatal(err)
	}
	table := Default().Merge(user)
	if m, ok := table.Match("loader: shard index 99 out of range"); !ok || m.Category != UserCode || m.Pattern != "our-dataloader-bug" {
		t.Errorf("a user rule: %+v %v", m, ok)
	}
	if m, ok := table.Match("LINK_DOWN_EVENT on rail 3"); !ok || m.Pattern != "link-down" {
		t.Errorf("a replaced rule: %+v %v", m, ok)
	}
	if _, ok := table.Match("ionic 0000:21:00.0 enp33s0: Link is down"); ok {
		t.Error("the shipped rule a user replaced still matches")
	}
	if m, ok := table.Match("Memory access fault by GPU node-2 (Agent handle: 0x1)"); !ok || m.Category != GPUHardware {
		t.Errorf("the shipped rules are lost: %+v", m)
	}
}

// Matching is linear: a pathological line against the whole table stays cheap. This is a
// bound, not a timing: a backtracking engine would not finish.
func TestMatchingAHostileMessageIsBounded(t *testing.T) {
	table := Default()
	evil := strings.Repeat("a", 1<<20) + "\n" + strings.Repeat("Traceback (most recent call last):x", 1<<12)
	done := make(chan struct{})
	go func() {
		table.Match(evil)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("matching a 1 MiB message did not end")
	}
}

// A user's table as large as allowed still adds to the shipped rules, never replaces them all.
func TestAFullUserTableKeepsTheShippedRules(t *testing.T) {
	ps := make([]Pattern, MaxPatterns)
	for i := range ps {
		ps[i] = Pattern{Name: "user-" + strconv.Itoa(i), Category: UserCode, Regexp: "user rule " + strconv.Itoa(i) + "$"}
	}
	user, err := Compile(ps)
	if err != nil {
		t.Fatal(err)
	}
	table := Default().Merge(user)
	if table.Len() != Default().Len()+MaxPatterns {
		t.Errorf("%d rules, want %d", table.Len(), Default().Len()+MaxPatterns)
	}
	if m, ok := table.Match("Memory access fault by GPU node-2 (Agent handle: 0x1)"); !ok || m.Category != GPUHardware {
		t.Errorf("the shipped rules are lost: %+v", m)
	}
}

// torchrunFailed is what torchrun (PyTorch 1.13) prints when a child fails: its log line, its
// own ChildFailedError traceback and the root cause block.
func torchrunFailed(failed, exitcode, traceback string) string {
	return "ERROR:torch.distributed.elastic.multiprocessing.api:failed (" + failed + ") local_rank: 1 (pid: 7697) of binary: /usr/bin/python3.11\n" +
		"Traceback (most recent call last):\n" +
		"  File \"/usr/bin/torchrun\", line 33, in <module>\n" +
		"    sys.exit(load_entry_point('torch==1.13.0a0+gitunknown', 'console_scripts', 'torchrun')())\n" +
		"  File \"/usr/lib/python3/dist-packages/torch/distributed/launcher/api.py\", line 246, in launch_agent\n" +
		"    raise ChildFailedError(\n" +
		"torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n" +
		"============================================================\n" +
		"t.py FAILED\n" +
		"------------------------------------------------------------\n" +
		"Failures:\n  <NO_OTHER_FAILURES>\n" +
		"------------------------------------------------------------\n" +
		"Root Cause (first observed failure):\n[0]:\n" +
		"  time      : 2026-11-28_16:08:50\n  host      : localhost\n  rank      : 1 (local_rank: 1)\n" +
		"  exitcode  : " + exitcode + "\n  error_file: <N/A>\n  traceback : " + traceback + "\n" +
		"============================================================"
}
