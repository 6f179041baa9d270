#!/usr/bin/env bash
# The PyTorch trainer's own floor in a restart, on this machine, with no cluster: how long
# Python takes to import torch, and N ranks on loopback to meet (gloo's env:// init) and
# all-reduce once, all started at once as a restarted gang's are. Each run prints rank 0's
# figures. Needs Debian's python3-torch (apt-get install python3-torch).
#   hack/bench-torch-floor.sh [RANKS] [RUNS]     (default 4 ranks, 3 runs)
set -euo pipefail
ranks=${1:-4} runs=${2:-3}
python=${PYTHON:-/usr/bin/python3}
"$python" -c 'import torch; print("torch", torch.__version__)'
for run in $(seq "$runs"); do
	port=$((29600 + run))
	for rank in $(seq 0 $((ranks - 1))); do
		MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=$ranks RANK=$rank "$python" -c '
import time
began = time.time()
import torch, torch.distributed as dist
imported = time.time()
dist.init_process_group("gloo")
met = time.time()
x = torch.ones(1)
dist.all_reduce(x)
done = time.time()
if dist.get_rank() == 0:
    print(f"run '"$run"': import {imported - began:.2f} s, rendezvous (init_process_group) {met - imported:.2f} s, first all-reduce {done - met:.3f} s", flush=True)
dist.destroy_process_group()
' &
	done
	wait
done
