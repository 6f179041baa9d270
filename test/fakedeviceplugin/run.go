package fakedeviceplugin

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// DefaultControlDirName is the control directory's name inside the device-plugin directory.
const DefaultControlDirName = "amd-fake-control"

// Config is one node's fake devices.
type Config struct {
	// PluginDir is the kubelet's device-plugin directory (kubelet.sock and the plugins'
	// sockets); default pluginapi.DevicePluginPath.
	PluginDir string
	// ControlDir holds the health control files; default PluginDir/amd-fake-control.
	ControlDir string
	// GPUs and NICs are the device counts; a resource with 0 is not served.
	GPUs, NICs int
	// DeviceSpecs adds device nodes to allocations (see the package documentation).
	DeviceSpecs bool
	// Resync is how often the sockets and the control directory are checked in case a
	// directory event was missed; default 10s.
	Resync time.Duration
}

func (c Config) withDefaults() Config {
	if c.PluginDir == "" {
		c.PluginDir = pluginapi.DevicePluginPath
	}
	if c.ControlDir == "" {
		c.ControlDir = filepath.Join(c.PluginDir, DefaultControlDirName)
	}
	if c.Resync <= 0 {
		c.Resync = 10 * time.Second
	}
	return c
}

// Plugins is the plugins cfg asks for.
func (c Config) Plugins() []*Plugin {
	var ps []*Plugin
	if c.GPUs > 0 {
		ps = append(ps, NewPlugin(GPUSpec(c.GPUs), c.DeviceSpecs))
	}
	if c.NICs > 0 {
		ps = append(ps, NewPlugin(NICSpec(c.NICs), c.DeviceSpecs))
	}
	return ps
}

// Run serves cfg's plugins and their health control until ctx ends, then removes the
// sockets. It returns early, with an error, if any of them fails.
func Run(ctx context.Context, cfg Config) error {
	cfg = cfg.withDefaults()
	if cfg.GPUs < 0 || cfg.NICs < 0 {
		return fmt.Errorf("device counts must not be negative (gpus %d, nics %d)", cfg.GPUs, cfg.NICs)
	}
	plugins := cfg.Plugins()
	if len(plugins) == 0 {
		return errors.New("no devices to serve")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(plugins)+1)
	var wg sync.WaitGroup
	wg.Go(func() {
		if errs[0] = controlLoop(ctx, cfg.ControlDir, cfg.Resync, plugins); errs[0] != nil {
			cancel()
		}
	})
	for k, p := range plugins {
		wg.Go(func() {
			if errs[k+1] = p.Serve(ctx, cfg.PluginDir, cfg.Resync); errs[k+1] != nil {
				errs[k+1] = fmt.Errorf("%s: %w", p.spec.ResourceName, errs[k+1])
				cancel()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
