package fakedeviceplugin

import (
	"fmt"
	"strconv"
	"strings"
)

// Kind is the short name of a fake resource: it prefixes device IDs and control-file names.
type Kind string

const (
	// GPU is amd.com/gpu, an MI300X.
	GPU Kind = "gpu"
	// NIC is amd.com/nic, a Pollara AI NIC.
	NIC Kind = "nic"
)

// Spec is one fake resource as the kubelet sees it.
type Spec struct {
	Kind         Kind
	ResourceName string
	// SocketName is the plugin's socket file in the device-plugin directory (the Endpoint it
	// registers).
	SocketName string
	Count      int
}

// GPUSpec is amd.com/gpu with n devices.
func GPUSpec(n int) Spec {
	return Spec{Kind: GPU, ResourceName: "amd.com/gpu", SocketName: "amd-gpu-fake.sock", Count: n}
}

// NICSpec is amd.com/nic with n devices.
func NICSpec(n int) Spec {
	return Spec{Kind: NIC, ResourceName: "amd.com/nic", SocketName: "amd-nic-fake.sock", Count: n}
}

// DeviceID is the ID of device i of kind k, e.g. gpu-3.
func DeviceID(k Kind, i int) string { return fmt.Sprintf("%s-%d", k, i) }

// ParseDeviceID is DeviceID's inverse for a resource with count devices.
func ParseDeviceID(k Kind, id string, count int) (int, error) {
	rest, ok := strings.CutPrefix(id, string(k)+"-")
	if !ok {
		return 0, fmt.Errorf("device %q is not a %s", id, k)
	}
	return parseIndex(rest, count)
}

// parseIndex reads a device index in canonical form (digits, no sign, no leading zero), so
// that each device has exactly one name.
func parseIndex(s string, count int) (int, error) {
	if s == "" || strings.Trim(s, "0123456789") != "" || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("index %q is not a canonical decimal number", s)
	}
	i, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("index %q: %w", s, err)
	}
	if i >= count {
		return 0, fmt.Errorf("index %d out of range (%d devices)", i, count)
	}
	return i, nil
}
