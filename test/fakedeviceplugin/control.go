package fakedeviceplugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"k8s.io/klog/v2"
)

// UnhealthyPrefix starts every control-file name: unhealthy-<kind>-<index>.
const UnhealthyPrefix = "unhealthy-"

// ControlName is the control-file name that marks device i of kind k unhealthy.
func ControlName(k Kind, i int) string { return UnhealthyPrefix + DeviceID(k, i) }

// ParseControlName reads a control-file name: the kind and index of the device it marks
// unhealthy, or an error for a name that marks nothing on a node with counts devices per kind.
func ParseControlName(name string, counts map[Kind]int) (Kind, int, error) {
	rest, ok := strings.CutPrefix(name, UnhealthyPrefix)
	if !ok {
		return "", 0, fmt.Errorf("control file %q: want %s<kind>-<index>", name, UnhealthyPrefix)
	}
	kind, index, ok := strings.Cut(rest, "-")
	if !ok {
		return "", 0, fmt.Errorf("control file %q: want %s<kind>-<index>", name, UnhealthyPrefix)
	}
	n, known := counts[Kind(kind)]
	if !known || n == 0 {
		return "", 0, fmt.Errorf("control file %q: no %q devices on this node", name, kind)
	}
	i, err := parseIndex(index, n)
	if err != nil {
		return "", 0, fmt.Errorf("control file %q: %w", name, err)
	}
	return Kind(kind), i, nil
}

// UnhealthyFromNames is the unhealthy devices per kind that the control-file names say, and
// the names that say nothing. Every kind in counts gets a set, empty when all are healthy.
func UnhealthyFromNames(names []string, counts map[Kind]int) (map[Kind]map[int]bool, []string) {
	out := make(map[Kind]map[int]bool, len(counts))
	for k := range counts {
		out[k] = map[int]bool{}
	}
	var bad []string
	for _, name := range names {
		if k, i, err := ParseControlName(name, counts); err == nil {
			out[k][i] = true
		} else {
			bad = append(bad, name)
		}
	}
	return out, bad
}

// controlLoop keeps each plugin's health equal to what the control directory says until ctx
// ends. The directory is read whole on each change and every resync, so a missed or
// coalesced event costs at most one resync period.
func controlLoop(ctx context.Context, dir string, resync time.Duration, plugins []*Plugin) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	counts := map[Kind]int{}
	for _, p := range plugins {
		counts[p.spec.Kind] = p.spec.Count
	}
	logged := map[string]bool{} // bad names already logged, so a resync does not repeat them
	watching := false
	scan := func() {
		// Re-create the directory (and the watch) if someone removed it.
		if !watching {
			watching = watchDir(w, dir)
		}
		entries, err := os.ReadDir(dir)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			watching = false // all healthy; the directory comes back on the next scan
		case err != nil:
			klog.ErrorS(err, "Cannot read the control directory; health unchanged", "dir", dir)
			return
		}
		var names []string
		for _, e := range entries {
			if !e.IsDir() {
				names = append(names, e.Name())
			}
		}
		unhealthy, bad := UnhealthyFromNames(names, counts)
		seen := map[string]bool{}
		for _, name := range bad {
			seen[name] = true
			if !logged[name] {
				klog.InfoS("Ignoring a control file that names no device", "dir", dir, "file", name,
					"want", UnhealthyPrefix+"<gpu|nic>-<index>")
			}
		}
		logged = seen
		for _, p := range plugins {
			p.SetUnhealthy(unhealthy[p.spec.Kind])
		}
	}
	scan()
	tick := time.NewTicker(resync)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-w.Events:
			if !ok {
				return errors.New("control directory watcher closed")
			}
			scan()
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("control directory watcher closed")
			}
			klog.ErrorS(err, "Control directory watch", "dir", dir)
			scan()
		case <-tick.C:
			scan()
		}
	}
}

// watchDir creates dir if need be and watches it, saying whether it does.
func watchDir(w *fsnotify.Watcher, dir string) bool {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		klog.ErrorS(err, "Cannot create the control directory", "dir", dir)
		return false
	}
	if err := w.Add(dir); err != nil {
		klog.ErrorS(err, "Cannot watch the control directory", "dir", dir)
		return false
	}
	return true
}
