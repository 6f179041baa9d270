#!/usr/bin/env bash
# hack/kind-e2e.sh: make test-kind for users with a registry. Everything is shared with
# hack/kind/e2e.sh but where the node image comes from: a public kindest/node of the pinned
# Kubernetes minor instead of the one hack/kind/node-image.sh builds (the project's own images
# are still built locally and loaded). KIND_NODE_IMAGE picks another; extra arguments go to
# `go test`. Needs Docker.
set -euo pipefail
export KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-kindest/node:v1.36.1}
exec "$(dirname "$0")/kind/e2e.sh" "$@"
