package fakedeviceplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// wait bounds every wait in these tests.
const wait = 10 * time.Second

// fakeKubelet is the kubelet's registration service on dir/kubelet.sock.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	srv  *grpc.Server
	regs chan *pluginapi.RegisterRequest
}

func (k *fakeKubelet) Register(ctx context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	select {
	case k.regs <- r:
		return &pluginapi.Empty{}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// startKubelet serves a fake kubelet on dir/kubelet.sock, as the kubelet does: any old
// socket removed, a new one created. Each fake kubelet has its own registrations, so a test
// knows which kubelet a plugin registered with.
func startKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	path := filepath.Join(dir, KubeletSocketName)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{srv: grpc.NewServer(), regs: make(chan *pluginapi.RegisterRequest, 16)}
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(l) }()
	t.Cleanup(k.srv.Stop)
	return k
}

// shortDir is a temporary directory with a path short enough for unix sockets.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "fdp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// nextRegistration waits for a registration and checks it is resource's.
func nextRegistration(t *testing.T, regs <-chan *pluginapi.RegisterRequest, want map[string]string) *pluginapi.RegisterRequest {
	t.Helper()
	select {
	case r := <-regs:
		endpoint, ok := want[r.GetResourceName()]
		if !ok {
			t.Fatalf("registration for unexpected resource %q", r.GetResourceName())
		}
		if r.GetVersion() != pluginapi.Version || r.GetEndpoint() != endpoint {
			t.Fatalf("registration %v: want version %s, endpoint %s", r, pluginapi.Version, endpoint)
		}
		if !r.GetOptions().GetGetPreferredAllocationAvailable() || r.GetOptions().GetPreStartRequired() {
			t.Errorf("registration options %v: want preferred allocation, no pre-start", r.GetOptions())
		}
		return r
	case <-time.After(wait):
		t.Fatalf("no registration within %v", wait)
		return nil
	}
}

// dialPlugin connects to a plugin's endpoint as the kubelet does.
func dialPlugin(t *testing.T, dir, endpoint string) pluginapi.DevicePluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

// health is a device list as ID → health.
func health(devs []*pluginapi.Device) map[string]string {
	m := map[string]string{}
	for _, d := range devs {
		m[d.GetID()] = d.GetHealth()
	}
	return m
}

// expectHealth reads the stream until a list has want's health for every device (and no
// other device), failing after wait.
func expectHealth(t *testing.T, stream grpc.ServerStreamingClient[pluginapi.ListAndWatchResponse], want map[string]string) {
	t.Helper()
	var last map[string]string
	for {
		r, err := stream.Recv()
		if err != nil {
			t.Fatalf("ListAndWatch: %v (last list %v, want %v)", err, last, want)
		}
		last = health(r.GetDevices())
		if fmt.Sprint(last) == fmt.Sprint(want) {
			return
		}
	}
}

func allHealthy(k Kind, n int, unhealthy ...int) map[string]string {
	m := map[string]string{}
	for i := range n {
		m[DeviceID(k, i)] = pluginapi.Healthy
	}
	for _, i := range unhealthy {
		m[DeviceID(k, i)] = pluginapi.Unhealthy
	}
	return m
}

func startRun(t *testing.T, cfg Config) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(wait):
			t.Errorf("Run did not return within %v of its context ending", wait)
		}
	}
	t.Cleanup(stop)
	return stop
}

func TestPluginAgainstFakeKubelet(t *testing.T) {
	dir := shortDir(t)
	regs := startKubelet(t, dir).regs
	control := filepath.Join(dir, "control")
	if err := os.Mkdir(control, 0o755); err != nil { // so the test can write into it at once
		t.Fatal(err)
	}
	stop := startRun(t, Config{PluginDir: dir, ControlDir: control, GPUs: 8, NICs: 4, Resync: time.Hour})

	want := map[string]string{"amd.com/gpu": "amd-gpu-fake.sock", "amd.com/nic": "amd-nic-fake.sock"}
	got := map[string]bool{}
	for range 2 {
		got[nextRegistration(t, regs, want).GetResourceName()] = true
	}
	if len(got) != 2 {
		t.Fatalf("registrations %v: want one per resource", got)
	}

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	gpu := dialPlugin(t, dir, "amd-gpu-fake.sock")
	nic := dialPlugin(t, dir, "amd-nic-fake.sock")

	opts, err := gpu.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil || !opts.GetGetPreferredAllocationAvailable() || opts.GetPreStartRequired() {
		t.Fatalf("GetDevicePluginOptions = %v, %v", opts, err)
	}

	gpuStream, err := gpu.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := gpuStream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if h := health(first.GetDevices()); fmt.Sprint(h) != fmt.Sprint(allHealthy(GPU, 8)) {
		t.Fatalf("first list %v: want 8 healthy GPUs", h)
	}
	nicStream, err := nic.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	expectHealth(t, nicStream, allHealthy(NIC, 4))

	resp, err := gpu.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"gpu-5", "gpu-1"}}, {DevicesIds: []string{"gpu-0"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(resp.GetContainerResponses()); n != 2 {
		t.Fatalf("%d container responses, want 2", n)
	}
	for k, want := range []string{"1,5", "0"} {
		c := resp.GetContainerResponses()[k]
		if env := c.GetEnvs(); env[EnvHIPVisible] != want || env[EnvROCRVisible] != want || env[EnvFake] != "1" {
			t.Errorf("container %d envs %v: want visible devices %s", k, env, want)
		}
		if len(c.GetDevices()) != 0 {
			t.Errorf("container %d device specs %v without -device-specs", k, c.GetDevices())
		}
	}
	_, err = gpu.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"gpu-8"}}}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("Allocate of an unknown device: %v, want InvalidArgument", err)
	}
	nresp, err := nic.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"nic-3", "nic-2"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if env := nresp.GetContainerResponses()[0].GetEnvs(); env[EnvNICs] != "ionic_2,ionic_3" || env[EnvFake] != "1" {
		t.Errorf("NIC envs %v", env)
	}

	pref, err := gpu.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: []string{"gpu-7", "gpu-2", "gpu-4", "gpu-3"}, MustIncludeDeviceIDs: []string{"gpu-7"}, AllocationSize: 3},
	}})
	if err != nil || fmt.Sprint(pref.GetContainerResponses()[0].GetDeviceIDs()) != "[gpu-2 gpu-3 gpu-7]" {
		t.Errorf("GetPreferredAllocation = %v, %v", pref, err)
	}
	if _, err := gpu.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: []string{"gpu-0"}}); err != nil {
		t.Errorf("PreStartContainer: %v", err)
	}

	// Health on command: a control file makes the device Unhealthy on the stream, removing it
	// Healthy again; a bad name changes nothing.
	touch(t, filepath.Join(control, "unhealthy-gpu-9"))
	touch(t, filepath.Join(control, "unhealthy-gpu-3"))
	expectHealth(t, gpuStream, allHealthy(GPU, 8, 3))
	touch(t, filepath.Join(control, "unhealthy-nic-0"))
	expectHealth(t, nicStream, allHealthy(NIC, 4, 0))
	if err := os.Remove(filepath.Join(control, "unhealthy-gpu-3")); err != nil {
		t.Fatal(err)
	}
	expectHealth(t, gpuStream, allHealthy(GPU, 8))

	// A new ListAndWatch (a new kubelet) starts from the current state.
	again, err := nic.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	expectHealth(t, again, allHealthy(NIC, 4, 0))

	// SIGTERM's path: the context ends, the streams end and the sockets are gone.
	stop()
	if _, err := gpuStream.Recv(); err == nil {
		t.Error("ListAndWatch stream still open after Run returned")
	}
	for _, s := range want {
		if _, err := os.Lstat(filepath.Join(dir, s)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket %s left behind: %v", s, err)
		}
	}
}

func TestPluginRegistersAgainWhenTheKubeletRestarts(t *testing.T) {
	dir := shortDir(t)
	k := startKubelet(t, dir)
	regs := k.regs
	want := map[string]string{"amd.com/gpu": "amd-gpu-fake.sock"}
	startRun(t, Config{PluginDir: dir, ControlDir: filepath.Join(dir, "c"), GPUs: 2, Resync: time.Hour})
	nextRegistration(t, regs, want)

	// The kubelet deletes every socket in the directory when it starts: the plugin serves a
	// new one and registers again.
	if err := os.Remove(filepath.Join(dir, "amd-gpu-fake.sock")); err != nil {
		t.Fatal(err)
	}
	nextRegistration(t, regs, want)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	stream, err := dialPlugin(t, dir, "amd-gpu-fake.sock").ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	expectHealth(t, stream, allHealthy(GPU, 2))

	// A new kubelet.sock alone is a new kubelet too.
	k.srv.Stop()
	k2 := startKubelet(t, dir)
	nextRegistration(t, k2.regs, want)

	// Both, in the kubelet's order: sockets deleted, then a new kubelet.sock.
	k2.srv.Stop()
	if err := os.Remove(filepath.Join(dir, "amd-gpu-fake.sock")); err != nil {
		t.Fatal(err)
	}
	nextRegistration(t, startKubelet(t, dir).regs, want)
}

func TestRegistrationIsRetriedUntilTheKubeletIsUp(t *testing.T) {
	dir := shortDir(t)
	startRun(t, Config{PluginDir: dir, GPUs: 1, Resync: time.Hour})
	// No kubelet yet: the first tries fail; the control directory defaults inside dir.
	deadline := time.Now().Add(wait)
	for !exists(filepath.Join(dir, DefaultControlDirName)) || !exists(filepath.Join(dir, "amd-gpu-fake.sock")) {
		if time.Now().After(deadline) {
			t.Fatal("plugin socket or control directory never appeared")
		}
		time.Sleep(10 * time.Millisecond) // polling the filesystem: there is nothing to wait on
	}
	nextRegistration(t, startKubelet(t, dir).regs, map[string]string{"amd.com/gpu": "amd-gpu-fake.sock"})
}

func TestRunRefusesNothingToServe(t *testing.T) {
	if err := Run(context.Background(), Config{PluginDir: shortDir(t)}); err == nil {
		t.Error("Run with no devices: want an error")
	}
	if err := Run(context.Background(), Config{PluginDir: shortDir(t), GPUs: -1, NICs: 1}); err == nil {
		t.Error("Run with a negative count: want an error")
	}
}

func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestSetUnhealthyNotifiesOnlyOnChange(t *testing.T) {
	p := NewPlugin(GPUSpec(4), false)
	_, changed := p.devices()
	p.SetUnhealthy(map[int]bool{9: true, -1: true, 2: false}) // nothing real: no change
	select {
	case <-changed:
		t.Fatal("notified without a change")
	default:
	}
	p.SetUnhealthy(map[int]bool{2: true})
	select {
	case <-changed:
	default:
		t.Fatal("not notified of a change")
	}
	devs, changed := p.devices()
	if fmt.Sprint(health(devs)) != fmt.Sprint(allHealthy(GPU, 4, 2)) {
		t.Errorf("devices %v", health(devs))
	}
	p.SetUnhealthy(map[int]bool{2: true})
	select {
	case <-changed:
		t.Fatal("notified of the same state again")
	default:
	}
}
