//go:build unix

package connector

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// openDirNoFollow opens rel under dir, creating missing levels, refusing to
// follow a symlink at any level of rel (dir itself is the operator's and
// may be one).
func openDirNoFollow(dir, rel string) (*os.File, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open directory: %w", err)
	}
	if rel != "." {
		for _, c := range strings.Split(filepath.ToSlash(rel), "/") {
			if err := unix.Mkdirat(fd, c, 0o750); err != nil && !errors.Is(err, unix.EEXIST) {
				unix.Close(fd)
				if isNameErr(err) {
					return nil, fmt.Errorf("%w: create a directory level: %w", errBadName, err)
				}
				return nil, fmt.Errorf("create a directory level: %w", err)
			}
			next, err := unix.Openat(fd, c, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			unix.Close(fd)
			if err != nil {
				if isNameErr(err) {
					return nil, fmt.Errorf("%w: a directory level is a symlink or not a directory: %w", errBadName, err)
				}
				return nil, fmt.Errorf("open a directory level: %w", err)
			}
			fd = next
		}
	}
	return os.NewFile(uintptr(fd), dir), nil
}

// writeTemp writes data to a new hidden file in parent, created
// exclusively and without following a symlink, synced, and returns its
// name. On failure nothing is left behind.
func writeTemp(parent *os.File, data []byte) (string, error) {
	name := tempName()
	fd, err := unix.Openat(int(parent.Fd()), name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return "", fmt.Errorf("create temp file: %w", err)
	}
	if err := fillTemp(parent, os.NewFile(uintptr(fd), name), name, data); err != nil {
		return "", err
	}
	return name, nil
}

// linkAt gives parent's file tmp the name name too. It never replaces
// what name already is (a file or a symlink, dangling or not): EEXIST. On
// a file system without hard links it renames tmp instead, where the
// kernel can do that without replacing anything.
func linkAt(parent *os.File, tmp, name string) error {
	err := unix.Linkat(int(parent.Fd()), tmp, int(parent.Fd()), name, 0)
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		if rerr := renameNoReplace(parent, tmp, name); !errors.Is(rerr, errNoRenameNoReplace) {
			return rerr
		}
	}
	return err
}

func removeAt(parent *os.File, name string) {
	_ = unix.Unlinkat(int(parent.Fd()), name, 0) // best effort: a leftover is a hidden temp file
}
