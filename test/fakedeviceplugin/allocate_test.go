package fakedeviceplugin

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func TestParseDeviceID(t *testing.T) {
	for _, tc := range []struct {
		kind  Kind
		id    string
		index int
		ok    bool
	}{
		{GPU, "gpu-0", 0, true},
		{GPU, "gpu-7", 7, true},
		{NIC, "nic-3", 3, true},
		{GPU, "gpu-8", 0, false},
		{GPU, "nic-0", 0, false},
		{NIC, "gpu-0", 0, false},
		{GPU, "gpu-07", 0, false},
		{GPU, "gpu--1", 0, false},
		{GPU, "gpu", 0, false},
		{GPU, "0000:0c:00.0", 0, false},
	} {
		i, err := ParseDeviceID(tc.kind, tc.id, 8)
		if ok := err == nil; ok != tc.ok || i != tc.index {
			t.Errorf("ParseDeviceID(%s, %q) = %d, %v; want %d, ok %v", tc.kind, tc.id, i, err, tc.index, tc.ok)
		}
		if tc.ok && DeviceID(tc.kind, i) != tc.id {
			t.Errorf("DeviceID(%s, %d) = %q, want %q", tc.kind, i, DeviceID(tc.kind, i), tc.id)
		}
	}
}

func specs(c *pluginapi.ContainerAllocateResponse) []string {
	var s []string
	for _, d := range c.GetDevices() {
		if d.GetHostPath() != d.GetContainerPath() || d.GetPermissions() != "rw" {
			s = append(s, "bad:"+d.String())
			continue
		}
		s = append(s, d.GetHostPath())
	}
	return s
}

func TestContainerResponse(t *testing.T) {
	for _, tc := range []struct {
		name        string
		spec        Spec
		ids         []string
		deviceSpecs bool
		env         map[string]string
		devices     []string
		err         bool
	}{
		{name: "GPUs, sorted, no device specs by default", spec: GPUSpec(8), ids: []string{"gpu-5", "gpu-1", "gpu-3"},
			env: map[string]string{EnvFake: "1", EnvHIPVisible: "1,3,5", EnvROCRVisible: "1,3,5"}},
		{name: "one GPU", spec: GPUSpec(8), ids: []string{"gpu-0"},
			env: map[string]string{EnvFake: "1", EnvHIPVisible: "0", EnvROCRVisible: "0"}},
		{name: "GPU device specs, as AMD's plugin", spec: GPUSpec(8), ids: []string{"gpu-2", "gpu-0"}, deviceSpecs: true,
			env:     map[string]string{EnvFake: "1", EnvHIPVisible: "0,2", EnvROCRVisible: "0,2"},
			devices: []string{"/dev/kfd", "/dev/dri/card0", "/dev/dri/renderD128", "/dev/dri/card2", "/dev/dri/renderD130"}},
		{name: "NICs", spec: NICSpec(8), ids: []string{"nic-7", "nic-0"},
			env: map[string]string{EnvFake: "1", EnvNICs: "ionic_0,ionic_7"}},
		{name: "NIC device specs", spec: NICSpec(8), ids: []string{"nic-1"}, deviceSpecs: true,
			env:     map[string]string{EnvFake: "1", EnvNICs: "ionic_1"},
			devices: []string{"/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs1"}},
		{name: "unknown GPU", spec: GPUSpec(8), ids: []string{"gpu-1", "gpu-8"}, err: true},
		{name: "a NIC asked of the GPU plugin", spec: GPUSpec(8), ids: []string{"nic-1"}, err: true},
		{name: "a device twice", spec: GPUSpec(8), ids: []string{"gpu-1", "gpu-1"}, err: true},
		{name: "unknown kind", spec: Spec{Kind: "tpu", Count: 1}, ids: []string{"tpu-0"}, err: true},
	} {
		got, err := ContainerResponse(tc.spec, tc.ids, tc.deviceSpecs)
		if (err != nil) != tc.err {
			t.Errorf("%s: error %v, want error %v", tc.name, err, tc.err)
			continue
		}
		if err != nil {
			continue
		}
		if !maps.Equal(got.GetEnvs(), tc.env) {
			t.Errorf("%s: envs %v, want %v", tc.name, got.GetEnvs(), tc.env)
		}
		if !slices.Equal(specs(got), tc.devices) {
			t.Errorf("%s: devices %v, want %v", tc.name, specs(got), tc.devices)
		}
		if len(got.GetMounts()) != 0 || len(got.GetAnnotations()) != 0 || len(got.GetCdiDevices()) != 0 {
			t.Errorf("%s: unexpected mounts, annotations or CDI devices: %v", tc.name, got)
		}
	}
}

func TestPreferredAllocation(t *testing.T) {
	all := []string{"gpu-7", "gpu-6", "gpu-5", "gpu-4", "gpu-3", "gpu-2", "gpu-1", "gpu-0"}
	for _, tc := range []struct {
		available, must []string
		size            int
		want            string
	}{
		{all, nil, 8, "[gpu-0 gpu-1 gpu-2 gpu-3 gpu-4 gpu-5 gpu-6 gpu-7]"},
		{all, nil, 2, "[gpu-0 gpu-1]"},
		{all, []string{"gpu-6"}, 2, "[gpu-0 gpu-6]"},
		{[]string{"gpu-4", "gpu-2"}, []string{"gpu-4"}, 2, "[gpu-2 gpu-4]"},
		{[]string{"gpu-3", "gpu-1"}, nil, 4, "[gpu-1 gpu-3]"},          // fewer available than asked
		{[]string{"gpu-3", "bogus", "gpu-9"}, nil, 2, "[gpu-3]"},       // not ours: skipped
		{[]string{"gpu-3", "gpu-3", "gpu-1"}, nil, 3, "[gpu-1 gpu-3]"}, // duplicates once
		{all, nil, 0, "[]"},
	} {
		if got := fmt.Sprint(PreferredAllocation(GPUSpec(8), tc.available, tc.must, tc.size)); got != tc.want {
			t.Errorf("PreferredAllocation(%v, must %v, %d) = %s, want %s", tc.available, tc.must, tc.size, got, tc.want)
		}
	}
}
