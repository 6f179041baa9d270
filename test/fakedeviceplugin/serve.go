package fakedeviceplugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// KubeletSocketName is the kubelet's registration socket in the device-plugin directory.
const KubeletSocketName = "kubelet.sock"

// Registration retry back-off: the kubelet is usually back within seconds.
const (
	registerBackoffMin = 500 * time.Millisecond
	registerBackoffMax = 10 * time.Second
	registerTimeout    = 10 * time.Second
)

// action is what the serve loop does about a change in the device-plugin directory.
type action int

const (
	actionNone action = iota
	// actionRegister registers again with a (new) kubelet.
	actionRegister
	// actionRestart serves a new socket, then registers.
	actionRestart
)

// eventAction decides what an event in the device-plugin directory calls for: a missing own
// socket (the kubelet deletes every socket when it starts) means serve a new one and
// register; kubelet.sock being created means a new kubelet to register with. ownExists is
// checked after the event, so a stale removal event (our own socket replaced since) is
// harmless.
func eventAction(ev fsnotify.Event, kubeletSock string, ownExists bool) action {
	switch {
	case !ownExists:
		return actionRestart
	case filepath.Clean(ev.Name) == filepath.Clean(kubeletSock) && ev.Has(fsnotify.Create):
		return actionRegister
	default:
		return actionNone
	}
}

// Serve serves p on its socket in dir and keeps it registered with the kubelet there until
// ctx ends; it then stops and removes the socket. resync is how often the socket's
// existence is checked in case a directory event was missed.
func (p *Plugin) Serve(ctx context.Context, dir string, resync time.Duration) error {
	own := filepath.Join(dir, p.spec.SocketName)
	kubelet := filepath.Join(dir, KubeletSocketName)
	// Watch before the socket exists, so no removal can slip between the two.
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("watch %s: %w", dir, err)
	}

	srv, errc, err := p.listen(own)
	if err != nil {
		return err
	}
	defer func() {
		srv.Stop()
		if err := os.Remove(own); err != nil && !errors.Is(err, fs.ErrNotExist) {
			klog.ErrorS(err, "Cannot remove the plugin socket", "socket", own)
		}
		klog.InfoS("Stopped", "resource", p.spec.ResourceName)
	}()
	restart := func() error {
		klog.InfoS("Serving a new plugin socket (the kubelet restarted, or the old one failed)", "socket", own)
		srv.Stop()
		s, c, err := p.listen(own)
		if err != nil {
			return err
		}
		srv, errc = s, c
		return nil
	}

	retry := time.NewTimer(0) // register straight away
	defer retry.Stop()
	backoff := registerBackoffMin
	tick := time.NewTicker(resync)
	defer tick.Stop()
	for {
		act := actionNone
		select {
		case <-ctx.Done():
			return nil
		case <-retry.C:
			if err := register(ctx, kubelet, p.spec); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				klog.InfoS("Registration with the kubelet failed; retrying", "resource", p.spec.ResourceName, "in", backoff, "err", err)
				retry.Reset(backoff)
				backoff = min(2*backoff, registerBackoffMax)
				continue
			}
			klog.InfoS("Registered with the kubelet", "resource", p.spec.ResourceName, "endpoint", p.spec.SocketName, "devices", p.spec.Count)
			backoff = registerBackoffMin
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("device-plugin directory watcher closed")
			}
			act = eventAction(ev, kubelet, exists(own))
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("device-plugin directory watcher closed")
			}
			klog.ErrorS(err, "Device-plugin directory watch", "dir", dir)
		case <-tick.C:
			if !exists(own) {
				act = actionRestart
			}
		case err := <-errc:
			klog.ErrorS(err, "gRPC server failed; serving a new socket", "socket", own)
			act = actionRestart
		}
		if act == actionRestart {
			if err := restart(); err != nil {
				return err
			}
		}
		if act != actionNone {
			backoff = registerBackoffMin
			retry.Reset(0)
		}
	}
}

// listen serves p on a fresh socket at path. The listener does not unlink the socket when it
// closes: after a kubelet restart the path may already be someone else's business, and Serve
// removes it itself on the way out. errc gets Serve's error if it fails on its own.
func (p *Plugin) listen(path string) (*grpc.Server, <-chan error, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Errorf("remove stale socket: %w", err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if ul, ok := l.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	errc := make(chan error, 1)
	go func() {
		// Serve returns nil once stopped; only a failure is worth reporting.
		if err := srv.Serve(l); err != nil {
			errc <- err
		}
	}()
	return srv, errc, nil
}

// register tells the kubelet behind kubeletSock about the plugin of spec.
func register(ctx context.Context, kubeletSock string, spec Spec) error {
	conn, err := grpc.NewClient("unix://"+kubeletSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     spec.SocketName,
		ResourceName: spec.ResourceName,
		Options:      options(),
	})
	return err
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
