package integration

import (
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// rawMergePatch is a JSON merge patch, as kubectl patch --type=merge sends it.
func rawMergePatch(p []byte) client.Patch { return client.RawPatch(types.MergePatchType, p) }
