# Shared helpers for hack/ scripts: source it, do not run it.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin="$root/bin"

# start_operator LOG [FLAG...]: runs bin/zaya-operator against $KUBECONFIG in the background
# and sets operator_pid. Callers wait on the objects it reconciles, not on a sleep.
start_operator() {
	local log=$1
	shift
	"$bin/zaya-operator" --kubeconfig "$KUBECONFIG" --metrics-bind-address=0 \
		--health-probe-bind-address=0 "$@" >"$log" 2>&1 &
	operator_pid=$!
}

# stop_operator: ends the operator started by start_operator, if any.
stop_operator() {
	[ -n "${operator_pid:-}" ] || return 0
	kill "$operator_pid" 2>/dev/null || true
	wait "$operator_pid" 2>/dev/null || true
	operator_pid=
}

# install_crd: applies the generated CRD (server-side: it embeds a whole pod template, too big
# for the client-side last-applied annotation) and waits until it is served.
install_crd() {
	"$bin/kubectl" apply --server-side --force-conflicts -f "$root/config/crd/bases" >/dev/null
	local i
	for i in $(seq 1 300); do
		[ "$("$bin/kubectl" get crd zayatrainingjobs.training.zaya.dev \
			-o jsonpath='{.status.conditions[?(@.type=="Established")].status}' 2>/dev/null)" = True ] && return 0
		sleep 0.1
	done
	echo "the CRD was not established within 30s" >&2
	return 1
}
