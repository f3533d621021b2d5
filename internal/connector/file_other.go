//go:build !unix

package connector

import (
	"fmt"
	"os"
	"path/filepath"
)

// openDirNoFollow opens rel under dir, creating missing levels. Outside
// unix a symlinked level is not detected.
func openDirNoFollow(dir, rel string) (*os.File, error) {
	p := filepath.Join(dir, rel)
	if err := os.MkdirAll(p, 0o750); err != nil {
		return nil, fmt.Errorf("create a directory level: %w", bareErr(err))
	}
	return os.Open(p)
}

func writeTemp(parent *os.File, data []byte) (string, error) {
	name := tempName()
	f, err := os.OpenFile(filepath.Join(parent.Name(), name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("create temp file: %w", bareErr(err))
	}
	if err := fillTemp(parent, f, name, data); err != nil {
		return "", err
	}
	return name, nil
}

func linkAt(parent *os.File, tmp, name string) error {
	return bareErr(os.Link(filepath.Join(parent.Name(), tmp), filepath.Join(parent.Name(), name)))
}

func removeAt(parent *os.File, name string) { _ = os.Remove(filepath.Join(parent.Name(), name)) }
