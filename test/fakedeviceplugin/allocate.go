package fakedeviceplugin

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Environment set on every allocation; see the package documentation.
const (
	EnvFake        = "AMD_FAKE_DEVICE_PLUGIN"
	EnvHIPVisible  = "HIP_VISIBLE_DEVICES"
	EnvROCRVisible = "ROCR_VISIBLE_DEVICES"
	EnvNICs        = "ZAYA_FAKE_NICS"
)

// ContainerResponse is the answer to one container's Allocate request for devices ids of
// spec: the environment always, device specs only with deviceSpecs. An ID that is not one of
// spec's devices is an error (the kubelet only asks for devices it was told about).
func ContainerResponse(spec Spec, ids []string, deviceSpecs bool) (*pluginapi.ContainerAllocateResponse, error) {
	idx := make([]int, 0, len(ids))
	for _, id := range ids {
		i, err := ParseDeviceID(spec.Kind, id, spec.Count)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", spec.ResourceName, err)
		}
		if slices.Contains(idx, i) {
			return nil, fmt.Errorf("%s: device %s requested twice", spec.ResourceName, id)
		}
		idx = append(idx, i)
	}
	slices.Sort(idx)
	r := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{EnvFake: "1"}}
	switch spec.Kind {
	case GPU:
		list := joinInts(idx, "")
		r.Envs[EnvHIPVisible] = list
		r.Envs[EnvROCRVisible] = list
		if deviceSpecs && len(idx) > 0 {
			// As AMD's plugin: one /dev/kfd for the node, a card and a render node per GPU.
			r.Devices = append(r.Devices, rw("/dev/kfd"))
			for _, i := range idx {
				r.Devices = append(r.Devices, rw(fmt.Sprintf("/dev/dri/card%d", i)), rw(fmt.Sprintf("/dev/dri/renderD%d", 128+i)))
			}
		}
	case NIC:
		r.Envs[EnvNICs] = joinInts(idx, "ionic_")
		if deviceSpecs && len(idx) > 0 {
			r.Devices = append(r.Devices, rw("/dev/infiniband/rdma_cm"))
			for _, i := range idx {
				r.Devices = append(r.Devices, rw(fmt.Sprintf("/dev/infiniband/uverbs%d", i)))
			}
		}
	default:
		return nil, fmt.Errorf("unknown device kind %q", spec.Kind)
	}
	return r, nil
}

// PreferredAllocation picks size devices: every one in mustInclude, then the lowest-indexed
// available ones, in index order. IDs that are not spec's devices are skipped.
func PreferredAllocation(spec Spec, available, mustInclude []string, size int) []string {
	type dev struct {
		id string
		i  int
	}
	var must, rest []dev
	for _, id := range mustInclude {
		if i, err := ParseDeviceID(spec.Kind, id, spec.Count); err == nil && !slices.ContainsFunc(must, func(d dev) bool { return d.i == i }) {
			must = append(must, dev{id, i})
		}
	}
	for _, id := range available {
		i, err := ParseDeviceID(spec.Kind, id, spec.Count)
		taken := func(d dev) bool { return d.i == i }
		if err == nil && !slices.ContainsFunc(must, taken) && !slices.ContainsFunc(rest, taken) {
			rest = append(rest, dev{id, i})
		}
	}
	byIndex := func(a, b dev) int { return cmp.Compare(a.i, b.i) }
	slices.SortFunc(rest, byIndex)
	picked := must
	if n := size - len(picked); n > 0 {
		picked = append(picked, rest[:min(n, len(rest))]...)
	}
	slices.SortFunc(picked, byIndex)
	out := make([]string, len(picked))
	for k, d := range picked {
		out[k] = d.id
	}
	return out
}

func rw(path string) *pluginapi.DeviceSpec {
	return &pluginapi.DeviceSpec{ContainerPath: path, HostPath: path, Permissions: "rw"}
}

func joinInts(idx []int, prefix string) string {
	s := make([]string, len(idx))
	for k, i := range idx {
		s[k] = prefix + strconv.Itoa(i)
	}
	return strings.Join(s, ",")
}
