//go:build e2e

package e2e

import "sigs.k8s.io/controller-runtime/pkg/client"

func clientInNamespace(ns string) client.ListOption { return client.InNamespace(ns) }
