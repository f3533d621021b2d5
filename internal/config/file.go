package config

import (
	"fmt"
	"path/filepath"
	"strings"
	"text/template"
	"time"
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

// Path returns the file a message is written to: Directory joined with the
// executed Filename template. Template values come from the message (a
// sender controls MSH-10), so names that are empty, absolute or climb out of
// Directory with ".." are refused rather than written.
func (f *FileDestination) Path(data FileNameData) (string, error) {
	tmpl := f.filename
	if tmpl == nil {
		// Built by hand rather than loaded; parse now, without caching,
		// so a shared FileDestination is never written to.
		var err error
		if tmpl, err = parseFilename(f.Filename); err != nil {
			return "", err
		}
	}
	var b strings.Builder
	if err := tmpl.Execute(&b, data); err != nil {
		return "", fmt.Errorf("execute filename template %q: %w", f.Filename, err)
	}
	name := b.String()
	if !filepath.IsLocal(name) {
		return "", fmt.Errorf("filename template %q produced %q, which is empty, absolute or outside the directory", f.Filename, name)
	}
	return filepath.Join(f.Directory, name), nil
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
