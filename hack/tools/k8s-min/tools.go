//go:build tools

// Package tools records the one command built from this module: the API server of the
// oldest Kubernetes the chart supports (its kubeVersion), for make test-min-kube.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
