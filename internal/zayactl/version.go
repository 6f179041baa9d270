package zayactl

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Version is the release that built the plugin (hack/release sets it with -ldflags -X).
var Version = ""

// version is Version, or the module's version when go install built the plugin at a tag.
func version() string {
	if Version != "" {
		return Version
	}
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" {
		return info.Main.Version
	}
	return "(devel)"
}

func (s *session) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "The plugin's version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintf(s.out, "kubectl-zaya %s %s/%s %s\n", version(), runtime.GOOS, runtime.GOARCH, runtime.Version())
			return err
		},
	}
}
