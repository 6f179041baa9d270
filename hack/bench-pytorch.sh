#!/usr/bin/env bash
# Fault → training again on 4 process-backed nodes of the local kwok cluster, one run: the
# PyTorch example (examples/pytorch) under zaya-supervisor restarting in place and recreating,
# and the reference worker in place, each through a rank killed, a node frozen and a node lost;
# then, for comparison, the PyTorch job under torchrun alone (a rank killed). Prints each
# fault's time to rank 0 training again, as the e2e tests log it. Needs Debian's python3-torch.
# About 10 to 30 minutes: torchrun alone waits in its exit barrier and its rendezvous.
#   hack/bench-pytorch.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export ZAYA_CLUSTER=${ZAYA_CLUSTER:-zaya-bench-pytorch}
out=$(mktemp)
ZAYA_E2E_PYTORCH_BENCH=1 ZAYA_E2E_TORCHRUN_ALONE=${ZAYA_E2E_TORCHRUN_ALONE:-1} "$root/hack/e2e.sh" \
	-run 'TestFaultToTrainingAgainBench|TestPyTorchUnderTorchrunAlone' -timeout 60m -v >"$out" 2>&1 || {
	tail -n 80 "$out"
	exit 1
}
grep -E 'training again|--- (PASS|FAIL)' "$out" | sed 's/^ *//'
rm -f "$out"
