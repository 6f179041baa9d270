package fakedeviceplugin

import (
	"testing"

	"github.com/fsnotify/fsnotify"
)

func TestEventAction(t *testing.T) {
	const kubelet = "/dp/kubelet.sock"
	ev := func(name string, op fsnotify.Op) fsnotify.Event { return fsnotify.Event{Name: name, Op: op} }
	for _, tc := range []struct {
		name      string
		ev        fsnotify.Event
		ownExists bool
		want      action
	}{
		{"own socket deleted by the kubelet", ev("/dp/amd-gpu-fake.sock", fsnotify.Remove), false, actionRestart},
		{"own socket renamed away", ev("/dp/amd-gpu-fake.sock", fsnotify.Rename), false, actionRestart},
		{"stale removal, socket since re-created", ev("/dp/amd-gpu-fake.sock", fsnotify.Remove), true, actionNone},
		{"own socket created", ev("/dp/amd-gpu-fake.sock", fsnotify.Create), true, actionNone},
		{"new kubelet", ev("/dp/kubelet.sock", fsnotify.Create), true, actionRegister},
		{"new kubelet, unclean path", ev("/dp//kubelet.sock", fsnotify.Create), true, actionRegister},
		{"new kubelet, own socket already gone", ev("/dp/kubelet.sock", fsnotify.Create), false, actionRestart},
		{"old kubelet gone", ev("/dp/kubelet.sock", fsnotify.Remove), true, actionNone},
		{"kubelet.sock chmod", ev("/dp/kubelet.sock", fsnotify.Chmod), true, actionNone},
		{"another plugin's socket", ev("/dp/other.sock", fsnotify.Remove), true, actionNone},
		{"another plugin's socket, ours gone too", ev("/dp/other.sock", fsnotify.Remove), false, actionRestart},
		{"checkpoint written", ev("/dp/kubelet_internal_checkpoint", fsnotify.Write), true, actionNone},
	} {
		if got := eventAction(tc.ev, kubelet, tc.ownExists); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
