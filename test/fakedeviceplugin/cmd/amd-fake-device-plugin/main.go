// Command amd-fake-device-plugin makes a kind worker look like an AMD MI300X node: fake
// amd.com/gpu and amd.com/nic devices served to the kubelet, health driven by files in a
// control directory, and (with -label-node) AMD's node labels. See package fakedeviceplugin.
package main

import (
	"context"
	"errors"
	"flag"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/zaya-operator/zaya-operator/test/fakedeviceplugin"
)

func main() {
	code := run()
	klog.Flush()
	os.Exit(code)
}

// run is main with an exit code, so that its deferred calls run.
func run() int {
	klog.InitFlags(nil)
	pluginDir := flag.String("plugin-dir", pluginapi.DevicePluginPath, "the kubelet's device-plugin directory (kubelet.sock)")
	controlDir := flag.String("control-dir", "", "health control directory (default <plugin-dir>/"+fakedeviceplugin.DefaultControlDirName+"): a file unhealthy-<gpu|nic>-<index> marks that device Unhealthy")
	gpus := flag.Int("gpus", 8, "amd.com/gpu devices (0: none)")
	nics := flag.Int("nics", 8, "amd.com/nic devices (0: none)")
	deviceSpecs := flag.Bool("device-specs", false, "add /dev/kfd, /dev/dri/* and /dev/infiniband/* device specs to allocations (only where those device nodes exist)")
	resync := flag.Duration("resync", 10*time.Second, "how often sockets and the control directory are re-checked in case an event was missed")
	labelNode := flag.Bool("label-node", false, "merge-patch AMD's GPU/NIC labels onto this node once at start")
	nodeName := flag.String("node-name", os.Getenv("NODE_NAME"), "this node's name (for -label-node; default $NODE_NAME)")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig for -label-node (default: in-cluster)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	var wg sync.WaitGroup
	if *labelNode {
		client, err := nodeClient(*nodeName, *kubeconfig)
		if err != nil {
			klog.ErrorS(err, "Cannot label the node")
			return 2
		}
		// Labelling runs beside the plugins: devices must not wait on the API server.
		wg.Go(func() {
			if err := fakedeviceplugin.LabelNode(ctx, client, *nodeName, fakedeviceplugin.NodeLabels(*gpus, *nics)); err != nil && !errors.Is(err, context.Canceled) {
				klog.ErrorS(err, "Labelling the node failed", "node", *nodeName)
			}
		})
	}
	cfg := fakedeviceplugin.Config{
		PluginDir:   filepath.Clean(*pluginDir),
		ControlDir:  *controlDir,
		GPUs:        *gpus,
		NICs:        *nics,
		DeviceSpecs: *deviceSpecs,
		Resync:      *resync,
	}
	klog.InfoS("Starting", "pluginDir", cfg.PluginDir, "gpus", cfg.GPUs, "nics", cfg.NICs, "deviceSpecs", cfg.DeviceSpecs)
	err := fakedeviceplugin.Run(ctx, cfg)
	stop()
	wg.Wait()
	if err != nil {
		klog.ErrorS(err, "Device plugin failed")
		return 1
	}
	klog.InfoS("Stopped cleanly")
	return 0
}

func nodeClient(node, kubeconfig string) (kubernetes.Interface, error) {
	if node == "" {
		return nil, errors.New("-label-node needs -node-name or $NODE_NAME")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.UserAgent = "amd-fake-device-plugin"
	return kubernetes.NewForConfig(cfg)
}
