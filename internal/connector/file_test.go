package connector

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mefor/mefor/internal/config"
)

// fileSend writes one message through a file sender for dir and template.
func fileSend(t *testing.T, dir, filename string, id int64, controlID string, payload string) Result {
	t.Helper()
	s := &FileSender{dest: &config.FileDestination{Directory: dir, Filename: filename}}
	return s.Send(context.Background(), Delivery{MessageID: id, ControlID: controlID, Channel: "adt", Destination: "archive", Payload: []byte(payload)})
}

// files lists the regular files under dir, relative to it, and fails on a
// leftover temp file.
func files(t *testing.T, dir string) map[string]string {
	t.Helper()
	got := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if strings.HasPrefix(d.Name(), ".mefor-") {
			t.Errorf("temp file left behind: %s", rel)
		}
		if d.Type()&os.ModeSymlink != 0 {
			got[rel] = "symlink"
			return nil
		}
		b, err := os.ReadFile(p)
		got[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// A control id is the sender's: whatever it holds, the file lands in the
// destination's directory under a name made of it, never elsewhere, and
// never fails for the name alone.
func TestFileNameFromControlIDIsSanitized(t *testing.T) {
	long := strings.Repeat("x", 300)
	for _, tt := range []struct {
		name, controlID, want string
	}{
		{"slash", "a/b", "a_b.hl7"},
		{"climbing", "../../etc/passwd", ".._.._etc_passwd.hl7"},
		{"backslash", `a\b`, "a_b.hl7"},
		{"NUL", "a\x00b", "a_b.hl7"},
		{"control characters", "a\r\n\tb\x7f", "a___b_.hl7"},
		{"300 bytes", long, strings.Repeat("x", config.MaxNameField) + ".hl7"},
		{"dot dot", "..", "__.hl7"},
		{"invalid UTF-8", "a\xffb", "a_b.hl7"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			res := fileSend(t, dir, "{{.ControlID}}.hl7", 1, tt.controlID, "MSH|1")
			if !res.OK {
				t.Fatalf("send: %+v", res)
			}
			if got := files(t, dir); len(got) != 1 || got[tt.want] != "MSH|1" {
				t.Fatalf("files %q, want only %q", got, tt.want)
			}
		})
	}

	// A control id that is the whole name: "." and ".." would name the
	// directory itself or its parent.
	for _, id := range []string{".", ".."} {
		dir := t.TempDir()
		if res := fileSend(t, dir, "{{.ControlID}}", 1, id, "MSH|1"); !res.OK {
			t.Fatalf("control id %q: %+v", id, res)
		}
		want := strings.Repeat("_", len(id))
		if got := files(t, dir); got[want] != "MSH|1" {
			t.Fatalf("control id %q: files %q, want %q", id, got, want)
		}
	}
}

// A repeated control id gets a suffix; no message's file is replaced.
func TestFileRepeatedControlIDGetsSuffix(t *testing.T) {
	dir := t.TempDir()
	for i, body := range []string{"first", "second", "third"} {
		if res := fileSend(t, dir, "{{.ControlID}}.hl7", int64(i+1), "C1", body); !res.OK {
			t.Fatalf("send %d: %+v", i, res)
		}
	}
	want := map[string]string{"C1.hl7": "first", "C1.1.hl7": "second", "C1.2.hl7": "third"}
	if got := files(t, dir); len(got) != 3 || got["C1.hl7"] != want["C1.hl7"] || got["C1.1.hl7"] != want["C1.1.hl7"] || got["C1.2.hl7"] != want["C1.2.hl7"] {
		t.Fatalf("files %q, want %q", got, want)
	}
}

// A symlink planted at the message's name is neither followed nor
// replaced: the message gets the next free name, and the symlink's target
// is untouched.
func TestFileSymlinkAtNameIsNotFollowed(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(dir, "C1.hl7")); err != nil {
		t.Fatal(err)
	}
	// A dangling one too: following it would create a file outside.
	if err := os.Symlink(filepath.Join(outside, "created"), filepath.Join(dir, "C2.hl7")); err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"C1", "C2"} {
		if res := fileSend(t, dir, "{{.ControlID}}.hl7", int64(i+1), id, "MSH|"+id); !res.OK {
			t.Fatalf("send %s: %+v", id, res)
		}
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Fatalf("symlink target overwritten: %q", b)
	}
	if _, err := os.Lstat(filepath.Join(outside, "created")); !os.IsNotExist(err) {
		t.Fatalf("dangling symlink followed: %v", err)
	}
	got := files(t, dir)
	if got["C1.hl7"] != "symlink" || got["C2.hl7"] != "symlink" || got["C1.1.hl7"] != "MSH|C1" || got["C2.1.hl7"] != "MSH|C2" {
		t.Fatalf("files %q", got)
	}
}

// A symlink where the template puts a directory is not followed: the name
// cannot be written, which is final (OutcomeBadName), and nothing is
// written through it. The description holds neither the name nor content.
func TestFileSymlinkedDirectoryIsNotFollowed(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	if err := os.Symlink(outside, filepath.Join(dir, "adt")); err != nil {
		t.Fatal(err)
	}
	res := fileSend(t, dir, "{{.Channel}}/{{.ControlID}}.hl7", 1, "SECRET-ID", "MSH|1")
	if res.OK || res.Outcome != OutcomeBadName {
		t.Fatalf("send: %+v, want %s", res, OutcomeBadName)
	}
	if strings.Contains(res.Error, "SECRET-ID") {
		t.Fatalf("error holds the control id: %q", res.Error)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Fatalf("written through the symlink: %v", entries)
	}
	files(t, dir) // no temp file left
}

// A name too long for the file system is final too, not retried.
func TestFileNameTooLongIsBadName(t *testing.T) {
	dir := t.TempDir()
	tmpl := "{{.ControlID}}{{.ControlID}}{{.ControlID}}.hl7" // 3 × 100 bytes
	res := fileSend(t, dir, tmpl, 1, strings.Repeat("y", 300), "MSH|1")
	if res.OK || res.Outcome != OutcomeBadName {
		t.Fatalf("send: %+v, want %s", res, OutcomeBadName)
	}
	if strings.Contains(res.Error, "yyyy") {
		t.Fatalf("error holds the control id: %q", res.Error)
	}
	files(t, dir)
}
