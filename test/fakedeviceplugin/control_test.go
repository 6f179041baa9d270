package fakedeviceplugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestParseControlName(t *testing.T) {
	counts := map[Kind]int{GPU: 8, NIC: 2}
	for _, tc := range []struct {
		name  string
		kind  Kind
		index int
		ok    bool
	}{
		{"unhealthy-gpu-0", GPU, 0, true},
		{"unhealthy-gpu-3", GPU, 3, true},
		{"unhealthy-gpu-7", GPU, 7, true},
		{"unhealthy-nic-1", NIC, 1, true},
		{"unhealthy-gpu-8", "", 0, false},  // out of range
		{"unhealthy-nic-2", "", 0, false},  // out of range for this kind
		{"unhealthy-gpu-03", "", 0, false}, // not canonical
		{"unhealthy-gpu-+3", "", 0, false}, // sign
		{"unhealthy-gpu--1", "", 0, false}, // negative
		{"unhealthy-gpu-", "", 0, false},   // no index
		{"unhealthy-gpu", "", 0, false},    // no index
		{"unhealthy-tpu-0", "", 0, false},  // unknown kind
		{"unhealthy-GPU-0", "", 0, false},  // case matters
		{"unhealthy-gpu-3 ", "", 0, false}, // trailing space
		{"unhealthy-gpu-3.tmp", "", 0, false},
		{"healthy-gpu-3", "", 0, false},
		{".unhealthy-gpu-3.swp", "", 0, false},
		{"gpu-3", "", 0, false},
		{"", "", 0, false},
		{"unhealthy-gpu-99999999999999999999", "", 0, false}, // overflows
	} {
		k, i, err := ParseControlName(tc.name, counts)
		if ok := err == nil; ok != tc.ok || k != tc.kind || i != tc.index {
			t.Errorf("ParseControlName(%q) = %q, %d, %v; want %q, %d, ok %v", tc.name, k, i, err, tc.kind, tc.index, tc.ok)
		}
	}
	if _, _, err := ParseControlName("unhealthy-nic-0", map[Kind]int{GPU: 8, NIC: 0}); err == nil {
		t.Error("a NIC control file on a node with no NICs: want an error")
	}
	for _, k := range []Kind{GPU, NIC} {
		for i := range 2 {
			if gk, gi, err := ParseControlName(ControlName(k, i), counts); err != nil || gk != k || gi != i {
				t.Errorf("ControlName(%s, %d) = %q does not parse back: %q %d %v", k, i, ControlName(k, i), gk, gi, err)
			}
		}
	}
}

func TestUnhealthyFromNames(t *testing.T) {
	counts := map[Kind]int{GPU: 8, NIC: 8}
	for _, tc := range []struct {
		names []string
		want  string
		bad   string
	}{
		{nil, "map[gpu:map[] nic:map[]]", "[]"},
		{[]string{"unhealthy-gpu-3", "unhealthy-gpu-5", "unhealthy-nic-0"}, "map[gpu:map[3:true 5:true] nic:map[0:true]]", "[]"},
		{[]string{"unhealthy-gpu-3", "README", "unhealthy-gpu-9"}, "map[gpu:map[3:true] nic:map[]]", "[README unhealthy-gpu-9]"},
	} {
		got, bad := UnhealthyFromNames(tc.names, counts)
		if fmt.Sprint(got) != tc.want || fmt.Sprint(bad) != tc.bad {
			t.Errorf("UnhealthyFromNames(%v) = %v, %v; want %s, %s", tc.names, got, bad, tc.want, tc.bad)
		}
	}
}

// The control loop follows the directory, including its removal (all healthy, and it comes
// back) and a file that was there before it started.
func TestControlLoopFollowsTheDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "control")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	touch(t, filepath.Join(dir, "unhealthy-gpu-1"))
	p := NewPlugin(GPUSpec(4), false)
	_, changed := p.devices()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- controlLoop(ctx, dir, 20*time.Millisecond, []*Plugin{p}) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("controlLoop: %v", err)
			}
		case <-time.After(wait):
			t.Error("controlLoop did not stop")
		}
	}()
	// waitFor waits for health changes until the unhealthy set is want.
	waitFor := func(want string) {
		t.Helper()
		timeout := time.After(wait)
		got := ""
		for {
			select {
			case <-changed:
			case <-timeout:
				t.Fatalf("unhealthy %s, want %s", got, want)
			}
			p.mu.Lock()
			got = fmt.Sprint(p.unhealthy)
			changed = p.changed
			p.mu.Unlock()
			if got == want {
				return
			}
		}
	}
	waitFor("map[1:true]")
	touch(t, filepath.Join(dir, "unhealthy-gpu-2"))
	waitFor("map[1:true 2:true]")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	waitFor("map[]")
	// The loop re-creates the directory on its resync; a file written then is seen.
	deadline := time.Now().Add(wait)
	for !exists(dir) {
		if time.Now().After(deadline) {
			t.Fatal("control directory not re-created")
		}
		time.Sleep(5 * time.Millisecond) // polling the filesystem: there is nothing to wait on
	}
	touch(t, filepath.Join(dir, "unhealthy-gpu-3"))
	waitFor("map[3:true]")
}
