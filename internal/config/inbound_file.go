package config

import (
	"path/filepath"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// FileInbound is a directory a channel takes files of HL7 messages from.
// Only the node holding the listener lease polls it, so a directory shared
// by every node is read by one of them at a time.
type FileInbound struct {
	// Directory is polled for files. Relative paths are resolved against
	// mefor's working directory. Subdirectories are not read.
	Directory string
	// Pattern is a glob matched against file names in Directory (not
	// paths), e.g. *.hl7. Defaults to *. Names starting with a dot are
	// never taken: many writers use them for files still being written.
	Pattern string
	// Poll is how often Directory is listed. Defaults to 1s.
	Poll time.Duration
	// Settle is how old a file's modification time must be before the
	// file is taken; a file must also have kept its size and modification
	// time since the previous poll. Defaults to 1s.
	Settle time.Duration
	// MoveTo receives each file once its messages are stored. Exactly one
	// of MoveTo and Delete is set.
	MoveTo string
	// Delete removes each file once its messages are stored.
	Delete bool
	// ErrorDir receives files that are not HL7 (or not wholly), each with a
	// note beside it, <name>.error.txt, saying why. Nothing of such a file
	// is stored.
	ErrorDir string
	// MaxFileSize is the largest file taken; a larger one goes to ErrorDir.
	// Defaults to 64 MiB.
	MaxFileSize int64
}

const (
	defaultFilePoll        = time.Second
	defaultFileSettle      = time.Second
	defaultMaxFileSize     = 64 << 20
	defaultFilePattern     = "*"
	maxFileSizeLimit       = 1 << 30
	fileInboundExampleHint = "e.g. inbound: {file: {directory: /data/inbox/lab, pattern: \"*.hl7\", move_to: /data/inbox/lab/done, error_dir: /data/inbox/lab/error}}"
)

func (l *loader) decodeFileInbound(n *yaml.Node, p path) *FileInbound {
	in := &FileInbound{
		Pattern:     defaultFilePattern,
		Poll:        defaultFilePoll,
		Settle:      defaultFileSettle,
		MaxFileSize: defaultMaxFileSize,
	}
	m := l.mapping(n, p, "directory", "pattern", "poll", "settle", "move_to", "delete", "error_dir", "max_file_size")
	decodeScalar(l, m, p, "directory", &in.Directory, asString)
	decodeScalar(l, m, p, "pattern", &in.Pattern, asString)
	decodeScalar(l, m, p, "poll", &in.Poll, parseDuration)
	decodeScalar(l, m, p, "settle", &in.Settle, parseDuration)
	decodeScalar(l, m, p, "move_to", &in.MoveTo, asString)
	decodeScalar(l, m, p, "delete", &in.Delete, parseBool)
	decodeScalar(l, m, p, "error_dir", &in.ErrorDir, asString)
	decodeScalar(l, m, p, "max_file_size", &in.MaxFileSize, parseSize)
	return in
}

func (l *loader) checkFileInbound(in *FileInbound, p path) {
	dp := p.key("directory")
	if in.Directory == "" && !l.failed(dp) {
		l.errorf(dp, "is required: the directory to take files from (%s)", strings.TrimPrefix(fileInboundExampleHint, "e.g. "))
	}
	pp := p.key("pattern")
	if _, err := filepath.Match(in.Pattern, "x"); err != nil || in.Pattern == "" {
		l.errorf(pp, "%q is not a file name pattern; use a glob such as \"*.hl7\" or \"ADT_*.txt\"", in.Pattern)
	} else if strings.ContainsRune(in.Pattern, '/') {
		l.errorf(pp, "%q names a path; the pattern matches file names in directory, e.g. \"*.hl7\" (subdirectories are not read)", in.Pattern)
	}
	l.positive(p, "poll", in.Poll, defaultFilePoll)
	if in.Settle < 0 {
		l.errorf(p.key("settle"), "must be 0 or more: how old a file must be before it is taken (e.g. settle: 1s)")
	}
	mp, delp := p.key("move_to"), p.key("delete")
	switch {
	case in.MoveTo != "" && in.Delete:
		l.errorf(delp, "is true but move_to is set too; keep one: move_to: DIR keeps each stored file there, delete: true removes it")
	case in.MoveTo == "" && !in.Delete && !l.failed(mp) && !l.failed(delp):
		l.errorf(mp, "is required (or delete: true): where each file goes once its messages are stored, e.g. move_to: %s",
			exampleSubdir(in.Directory, "done"))
	}
	ep := p.key("error_dir")
	if in.ErrorDir == "" && !l.failed(ep) {
		l.errorf(ep, "is required: where files that are not HL7 go, each with a note saying why, e.g. error_dir: %s",
			exampleSubdir(in.Directory, "error"))
	}
	if in.Directory != "" {
		same := func(other string) bool { return other != "" && filepath.Clean(other) == filepath.Clean(in.Directory) }
		if same(in.MoveTo) {
			l.errorf(mp, "is the directory files are taken from; use another one, e.g. move_to: %s", exampleSubdir(in.Directory, "done"))
		}
		if same(in.ErrorDir) {
			l.errorf(ep, "is the directory files are taken from; use another one, e.g. error_dir: %s", exampleSubdir(in.Directory, "error"))
		}
	}
	if in.MoveTo != "" && in.ErrorDir != "" && filepath.Clean(in.MoveTo) == filepath.Clean(in.ErrorDir) {
		l.errorf(ep, "is also move_to; keep files that failed apart from stored ones, e.g. error_dir: %s", exampleSubdir(in.Directory, "error"))
	}
	if in.MaxFileSize <= 0 || in.MaxFileSize > maxFileSizeLimit {
		l.errorf(p.key("max_file_size"), "must be from 1 byte to 1GiB (e.g. max_file_size: 64MiB)")
	}
}

func exampleSubdir(dir, sub string) string {
	if dir == "" {
		return "/data/inbox/lab/" + sub
	}
	return filepath.Join(dir, sub)
}

// checkDirectoriesUnique reports channels that would take files from the
// same directory: each file would go to whichever channel saw it first.
func (l *loader) checkDirectoriesUnique(channels []Channel) {
	seen := map[string]string{}
	for _, ch := range channels {
		in := ch.Inbound.File
		if in == nil || in.Directory == "" {
			continue
		}
		dir := filepath.Clean(in.Directory)
		if other, dup := seen[dir]; dup {
			l.errorf(path{section: "channels"}.entity(ch.Name).key("inbound").key("file").key("directory"),
				"%s is already channel %q's directory; give each channel its own", in.Directory, other)
			continue
		}
		seen[dir] = ch.Name
	}
}
