package config

import (
	"fmt"
	"path/filepath"
	"strings"
	"text/template"
	"time"
	"unicode"
	"unicode/utf8"
)

// DefaultFilename is the filename template of a file destination that
// doesn't set one: the message ID is unique, so files never collide.
const DefaultFilename = "{{.MessageID}}.hl7"

// FileDestination writes each message to its own file.
type FileDestination struct {
	// Directory receives the files. A relative directory is resolved
	// against the working directory of the mefor process, not against the
	// configuration file's directory.
	Directory string
	// Filename is a text/template executed with FileNameData. It may
	// contain "/" to spread files over subdirectories but can't leave
	// Directory.
	Filename string

	// filename is Filename parsed at load time.
	filename *template.Template
}

// FileNameData is what a file destination's Filename template can refer to,
// as in "{{.Channel}}/{{.ControlID}}.hl7".
type FileNameData struct {
	MessageID    string
	ControlID    string // MSH-10
	Channel      string
	MessageType  string // MSH-9.1
	TriggerEvent string // MSH-9.2
	Destination  string
	Seq          int64
	Received     time.Time
}

// Path returns the file a message is written to: Directory joined with
// Name.
func (f *FileDestination) Path(data FileNameData) (string, error) {
	name, err := f.Name(data)
	if err != nil {
		return "", err
	}
	return filepath.Join(f.Directory, name), nil
}

// Name returns the message's file name relative to Directory: the executed
// Filename template. Template values taken from the message (a sender
// controls MSH-9 and MSH-10) are made safe first (SafeNameField), so they
// can neither add a directory level nor climb out of Directory; a name that
// is still empty, absolute or outside Directory (the template itself) is
// refused rather than written.
func (f *FileDestination) Name(data FileNameData) (string, error) {
	tmpl := f.filename
	if tmpl == nil {
		// Built by hand rather than loaded; parse now, without caching,
		// so a shared FileDestination is never written to.
		var err error
		if tmpl, err = parseFilename(f.Filename); err != nil {
			return "", err
		}
	}
	data.ControlID = SafeNameField(data.ControlID)
	data.MessageType = SafeNameField(data.MessageType)
	data.TriggerEvent = SafeNameField(data.TriggerEvent)
	var b strings.Builder
	if err := tmpl.Execute(&b, data); err != nil {
		return "", fmt.Errorf("execute filename template %q: %w", f.Filename, err)
	}
	name := b.String()
	if !filepath.IsLocal(name) {
		// The name is not quoted: it may hold a sender's field.
		return "", fmt.Errorf("filename template %q produced a name that is empty, absolute or outside the directory", f.Filename)
	}
	return name, nil
}

// MaxNameField is the most bytes a message field contributes to a file
// name. MSH-10 is at most 199 characters in HL7 v2.7, and a file name
// component at most 255 bytes on common file systems, so a sender's field
// cannot make the name unwritable alone.
const MaxNameField = 100

// SafeNameField returns s as a file name part: path separators, NUL, other
// control characters and invalid UTF-8 each become "_", the result is cut to
// MaxNameField bytes (on a character boundary), and "." or ".." become "_"
// or "__", so a field can never name the directory itself or its parent.
func SafeNameField(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r == '/' || r == '\\' || r == utf8.RuneError || unicode.IsControl(r) {
			r = '_'
		}
		if b.Len()+utf8.RuneLen(r) > MaxNameField {
			break
		}
		b.WriteRune(r)
	}
	out := b.String()
	if out == "." || out == ".." {
		out = strings.Repeat("_", len(out))
	}
	return out
}

func parseFilename(text string) (*template.Template, error) {
	tmpl, err := template.New("filename").Parse(text)
	if err != nil {
		return nil, fmt.Errorf("parse filename template %q: %w", text, err)
	}
	return tmpl, nil
}

// sampleFileNameData is what a filename template is tried with at load time,
// so a misspelled field fails then rather than on the first message.
func sampleFileNameData(destination string) FileNameData {
	return FileNameData{
		MessageID:    "01J9Z3K5E8X7Q2M4N6P8R0T2V4",
		ControlID:    "MSG00001",
		Channel:      "adt",
		MessageType:  "ADT",
		TriggerEvent: "A01",
		Destination:  destination,
		Seq:          1,
		Received:     time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC),
	}
}
