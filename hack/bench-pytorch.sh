#!/usr/bin/env bash
# The PyTorch example (examples/pytorch) through faults on 4 process-backed nodes of the local
# kwok cluster: under zaya-supervisor (a rank killed, a node frozen, a node lost) and, for
# comparison, under torchrun alone (a rank killed). Prints each fault's time to rank 0 training
# again, as the e2e tests log it. Needs Debian's python3-torch. About 5 to 25 minutes: torchrun
# alone waits in its exit barrier and its rendezvous.
#   hack/bench-pytorch.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export ZAYA_CLUSTER=${ZAYA_CLUSTER:-zaya-bench-pytorch}
out=$(mktemp)
ZAYA_E2E_TORCHRUN_ALONE=1 "$root/hack/e2e.sh" -run 'TestAPyTorchJobTrainsResumesAndFinishes|TestPyTorchUnderTorchrunAlone' -v >"$out" 2>&1 || {
	tail -n 80 "$out"
	exit 1
}
grep -E 'training again|--- (PASS|FAIL)' "$out" | sed 's/^ *//'
rm -f "$out"
