package filesource

import (
	"os"
	"path/filepath"
	"testing"
)

// A file moved where one of its name already is keeps both: nothing in
// move_to or error_dir is ever overwritten.
func TestMoveAsideNeverOverwrites(t *testing.T) {
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "done")
	write := func(dir, name, content string) {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	write(src, "r.hl7", "first")
	got, err := moveAside(filepath.Join(src, "r.hl7"), dst, "r.hl7", "1")
	if err != nil || got != filepath.Join(dst, "r.hl7") {
		t.Fatalf("first move: %q, %v", got, err)
	}
	write(src, "r.hl7", "second")
	got, err = moveAside(filepath.Join(src, "r.hl7"), dst, "r.hl7", "2")
	if err != nil || got != filepath.Join(dst, "r.hl7.2") {
		t.Fatalf("second move: %q, %v", got, err)
	}
	for name, want := range map[string]string{"r.hl7": "first", "r.hl7.2": "second"} {
		if b, err := os.ReadFile(filepath.Join(dst, name)); err != nil || string(b) != want {
			t.Fatalf("%s: %q, %v; want %q", name, b, err, want)
		}
	}
	if _, err := os.Stat(filepath.Join(src, "r.hl7")); !os.IsNotExist(err) {
		t.Fatalf("source still there: %v", err)
	}
}

func TestCopyThenRemove(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := os.WriteFile(src, []byte("content"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := copyThenRemove(src, dst); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(dst); err != nil || string(b) != "content" {
		t.Fatalf("copy: %q, %v", b, err)
	}
	if _, err := os.Stat(src); !os.IsNotExist(err) {
		t.Fatal("source not removed")
	}
}
