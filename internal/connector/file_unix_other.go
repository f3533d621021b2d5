//go:build unix && !linux

package connector

import (
	"errors"
	"os"
)

var errNoRenameNoReplace = errors.New("rename without replacing is not supported")

func renameNoReplace(*os.File, string, string) error { return errNoRenameNoReplace }
