package supervisor

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// InstalledName is the file Install writes into its folder.
const InstalledName = "zaya-supervisor"

// Install copies the running executable into dir as InstalledName, so an init container of
// the supervisor's image can hand it to a worker container of any image through a shared
// emptyDir: no shell and no cp are needed in either image. The copy is written beside and
// renamed into place, so a worker never runs a half-written file.
func Install(dir string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("install: finding this executable: %w", err)
	}
	return installFrom(self, dir)
}

func installFrom(src, dir string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	defer func() { _ = in.Close() }()
	tmp, err := os.CreateTemp(dir, "."+InstalledName+"-*")
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // gone once renamed
	if _, err := io.Copy(tmp, in); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("install: copying to %s: %w", dir, err)
	}
	if err := tmp.Chmod(0o555); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("install: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("install: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, InstalledName)); err != nil {
		return fmt.Errorf("install: %w", err)
	}
	return nil
}
