//go:build !(rocm && cgo)

package rocm

import (
	"context"
	"errors"
	"testing"

	"github.com/zaya-operator/zaya-operator/workers/transport"
)

func TestWithoutTheTagEverythingSaysHowToGetIt(t *testing.T) {
	if _, err := OpenBackend(Libraries{}, "/opt/zaya/kernels", 0); !errors.Is(err, ErrNotBuilt) {
		t.Errorf("OpenBackend: %v", err)
	}
	if _, err := DialRCCL(context.Background(), transport.Config{}, 0, Libraries{}); !errors.Is(err, ErrNotBuilt) {
		t.Errorf("DialRCCL: %v", err)
	}
	if Built {
		t.Error("Built is true in a build without the rocm tag")
	}
}
