package connector

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// errNoRenameNoReplace: the system or file system cannot rename without
// replacing.
var errNoRenameNoReplace = errors.New("rename without replacing is not supported")

// renameNoReplace renames tmp to name in parent unless name exists
// (EEXIST).
func renameNoReplace(parent *os.File, tmp, name string) error {
	err := unix.Renameat2(int(parent.Fd()), tmp, int(parent.Fd()), name, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
		return errNoRenameNoReplace
	}
	return err
}
