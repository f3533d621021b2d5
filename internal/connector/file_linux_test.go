package connector

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// The fallback for file systems without hard links never replaces a file
// either.
func TestRenameNoReplaceKeepsExistingFile(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{"tmp": "new", "taken": "old"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	parent, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer parent.Close()
	err = renameNoReplace(parent, "tmp", "taken")
	if errors.Is(err, errNoRenameNoReplace) {
		t.Skip("this file system cannot rename without replacing")
	}
	if !errors.Is(err, syscall.EEXIST) {
		t.Fatalf("rename onto a taken name: %v, want EEXIST", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "taken")); string(b) != "old" {
		t.Fatalf("taken file now %q", b)
	}
	if err := renameNoReplace(parent, "tmp", "free"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "free")); string(b) != "new" {
		t.Fatalf("renamed file %q", b)
	}
}
