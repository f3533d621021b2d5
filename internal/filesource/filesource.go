// Package filesource takes files of HL7 messages from a channel's directory.
//
// # Model
//
// A Poller lists its directory every poll interval and takes the files that
// have settled: a file must have kept its size and modification time since
// the previous listing, and be older than the settle time, so a file still
// being written (copied in, appended to) is left for a later poll. It also
// must not change while it is read; if it does, it is left too. Files are
// taken oldest first (by modification time, then name), one at a time.
//
// A file is taken whole or not at all. Its content is split into messages
// (hl7.SplitFile: any line ending, batch envelopes unwrapped and their
// counts checked) and each message must parse; then all of them are stored
// in one transaction (Store), together with the file's name, size and
// SHA-256. Only after that commit is the file moved to move_to, or deleted.
// A file that cannot be taken whole goes to error_dir with a note beside
// it, <name>.error.txt, saying why; nothing of it is stored.
//
// # Failure cases
//
//   - The node stops, or loses the listener lease, between the commit and
//     the move: the file is still in the directory at the next poll, of
//     this node or of the one that took the lease over. Store finds it
//     recorded (same channel, name, size and hash) and stores nothing; the
//     poller then moves it. No message is stored twice.
//   - The database is unreachable: nothing is stored, the file stays, and
//     the next poll tries again.
//   - The move fails (a full disk, a permission): the file stays and is
//     moved, without being stored again, at a later poll; this is logged.
//   - The lease is lost mid-poll: the poller checks the gate before each
//     file, its context is cancelled by the node, and the store checks the
//     lease in its transaction, so a node that may no longer hold it stores
//     nothing.
//
// Logs name files, sizes and message ids, never content.
package filesource

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/tick"
)

// File is one file taken whole: every message in it parsed.
type File struct {
	Channel string
	// Name is the file's name in the directory.
	Name     string
	Size     int64
	SHA256   [sha256.Size]byte
	Messages []Message
}

// Message is one message of a file, in file order.
type Message struct {
	// Raw is the message with its segments joined by \r.
	Raw []byte
	Msg *hl7.Message
}

// Stored is what Store did with a file.
type Stored struct {
	FileID     int64
	MessageIDs []int64
	// Duplicate: the same file was stored before and nothing was stored
	// now; it only has to be moved away.
	Duplicate bool
}

// Store stores all of a file's messages, and its record, in one
// transaction: when it returns nil, they are committed.
type Store interface {
	StoreFile(ctx context.Context, f *File) (Stored, error)
}

// Config configures a Poller.
type Config struct {
	Channel string
	Inbound *config.FileInbound
	Store   Store
	// Serving is the listener lease's gate: the poller takes no file while
	// it is false.
	Serving func() bool
	Logger  *slog.Logger
	// Now is the clock files' ages are judged by; time.Now when nil.
	Now func() time.Time
}

// Poller takes one channel's files. It is not safe for concurrent use: one
// goroutine runs it.
type Poller struct {
	cfg  Config
	in   config.FileInbound
	seen map[string]observation
	// failing remembers the last problem logged per file, so a file that
	// keeps failing (an error_dir that cannot be written) is logged once.
	failing map[string]string
	dirErr  string
}

// observation is a file as one listing saw it.
type observation struct {
	size  int64
	mtime time.Time
}

// New returns a poller, or an error when what its safety rests on is
// missing.
func New(cfg Config) (*Poller, error) {
	switch {
	case cfg.Channel == "":
		return nil, errors.New("filesource: no channel")
	case cfg.Inbound == nil || cfg.Inbound.Directory == "" || cfg.Inbound.ErrorDir == "":
		return nil, fmt.Errorf("filesource: channel %q: a directory and an error_dir are required", cfg.Channel)
	case cfg.Inbound.MoveTo == "" && !cfg.Inbound.Delete:
		return nil, fmt.Errorf("filesource: channel %q: move_to or delete is required, or a stored file would stay", cfg.Channel)
	case cfg.Inbound.Poll <= 0:
		return nil, fmt.Errorf("filesource: channel %q: the poll interval must be positive", cfg.Channel)
	case cfg.Store == nil:
		return nil, fmt.Errorf("filesource: channel %q: no store", cfg.Channel)
	case cfg.Serving == nil:
		return nil, fmt.Errorf("filesource: channel %q: no lease gate; only the lease holder may poll", cfg.Channel)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.Logger = cfg.Logger.With("channel", cfg.Channel)
	return &Poller{cfg: cfg, in: *cfg.Inbound, seen: map[string]observation{}, failing: map[string]string{}}, nil
}

// Run polls until ctx ends, the first time at once.
func (p *Poller) Run(ctx context.Context) {
	tick.Now(ctx, p.in.Poll, p.Poll)
}

// Poll lists the directory once and takes the files that have settled.
func (p *Poller) Poll(ctx context.Context) {
	if !p.cfg.Serving() {
		return
	}
	entries, err := os.ReadDir(p.in.Directory)
	if err != nil {
		if msg := err.Error(); msg != p.dirErr {
			p.dirErr = msg
			p.cfg.Logger.ErrorContext(ctx, "cannot list the channel's directory; retrying each poll", "directory", p.in.Directory, "error", err)
		}
		return
	}
	p.dirErr = ""
	now := p.cfg.Now()
	type candidate struct {
		name string
		obs  observation
	}
	var ready []candidate
	present := map[string]bool{}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !e.Type().IsRegular() {
			continue
		}
		if ok, _ := filepath.Match(p.in.Pattern, name); !ok {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue // gone since the listing
		}
		obs := observation{size: info.Size(), mtime: info.ModTime()}
		present[name] = true
		prev, seen := p.seen[name]
		p.seen[name] = obs
		if seen && prev == obs && now.Sub(obs.mtime) >= p.in.Settle {
			ready = append(ready, candidate{name, obs})
		}
	}
	for name := range p.seen {
		if !present[name] {
			delete(p.seen, name)
			delete(p.failing, name)
		}
	}
	slices.SortFunc(ready, func(a, b candidate) int {
		if c := a.obs.mtime.Compare(b.obs.mtime); c != 0 {
			return c
		}
		return strings.Compare(a.name, b.name)
	})
	for _, c := range ready {
		if ctx.Err() != nil || !p.cfg.Serving() {
			return
		}
		if !p.take(ctx, c.name, c.obs) {
			return
		}
	}
}

// take takes one file. It returns false when polling should stop for now
// (the store failed: the next poll tries again).
func (p *Poller) take(ctx context.Context, name string, obs observation) bool {
	path := filepath.Join(p.in.Directory, name)
	log := p.cfg.Logger.With("file", name, "size", obs.size)
	if obs.size > p.in.MaxFileSize {
		p.reject(ctx, name, obs, fmt.Sprintf("the file is %d bytes, larger than max_file_size (%d bytes)", obs.size, p.in.MaxFileSize))
		return true
	}
	data, still, err := read(path, obs)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return true // taken away meanwhile
	case err != nil:
		p.fail(ctx, name, "cannot read the file; retrying each poll", err)
		return true
	case !still:
		log.DebugContext(ctx, "file changed while it was read; left for a later poll")
		delete(p.seen, name)
		return true
	}
	f := &File{Channel: p.cfg.Channel, Name: name, Size: int64(len(data)), SHA256: sha256.Sum256(data)}
	raws, err := hl7.SplitFile(data)
	if err != nil {
		p.reject(ctx, name, obs, err.Error())
		return true
	}
	for i, raw := range raws {
		msg, err := hl7.Parse(raw)
		if err != nil {
			p.reject(ctx, name, obs, fmt.Sprintf("message %d of %d is not a valid HL7 v2 message: %v", i+1, len(raws), err))
			return true
		}
		f.Messages = append(f.Messages, Message{Raw: raw, Msg: msg})
	}
	stored, err := p.cfg.Store.StoreFile(ctx, f)
	if err != nil {
		if ctx.Err() == nil {
			log.ErrorContext(ctx, "file not stored; it stays and is tried again at the next poll", "messages", len(f.Messages), "error", err)
		}
		return false
	}
	if stored.Duplicate {
		log.InfoContext(ctx, "file was stored before (same name, size and SHA-256) but not moved away; moving it without storing it again",
			"file_id", stored.FileID)
	} else {
		log.InfoContext(ctx, "file stored", "file_id", stored.FileID, "messages", len(stored.MessageIDs),
			"first_message_id", stored.MessageIDs[0], "last_message_id", stored.MessageIDs[len(stored.MessageIDs)-1])
	}
	p.done(ctx, name, stored.FileID)
	return true
}

// read reads the file and reports whether it is still the one the listing
// saw: same size and modification time, before and after the read.
func read(path string, obs observation) ([]byte, bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, obs.size+1))
	if err != nil {
		return nil, false, err
	}
	info, err := f.Stat()
	if err != nil {
		return nil, false, err
	}
	still := int64(len(data)) == obs.size && info.Size() == obs.size && info.ModTime().Equal(obs.mtime)
	return data, still, nil
}

// done moves or deletes a stored file.
func (p *Poller) done(ctx context.Context, name string, fileID int64) {
	src := filepath.Join(p.in.Directory, name)
	if p.in.Delete {
		if err := os.Remove(src); err != nil && !errors.Is(err, fs.ErrNotExist) {
			p.fail(ctx, name, "file stored, but it cannot be deleted; it stays and is deleted at a later poll without being stored again", err)
			return
		}
		delete(p.seen, name)
		return
	}
	dst, err := moveAside(src, p.in.MoveTo, name, strconv.FormatInt(fileID, 10))
	if err != nil {
		p.fail(ctx, name, "file stored, but it cannot be moved to move_to; it stays and is moved at a later poll without being stored again", err)
		return
	}
	delete(p.seen, name)
	p.cfg.Logger.DebugContext(ctx, "file moved", "file", name, "to", dst)
}

// reject moves a file that cannot be taken whole to error_dir, with a note
// beside it saying why.
func (p *Poller) reject(ctx context.Context, name string, obs observation, why string) {
	src := filepath.Join(p.in.Directory, name)
	tag := p.cfg.Now().UTC().Format("20060102T150405.000000000Z")
	dst, err := moveAside(src, p.in.ErrorDir, name, tag)
	if err != nil {
		p.fail(ctx, name, "file is not HL7 and cannot be moved to error_dir; it stays, nothing of it is stored", err, "reason", why)
		return
	}
	note := fmt.Sprintf("mefor did not take this file for channel %s.\n\nFile: %s (%d bytes, modified %s)\nMoved here: %s\nWhy: %s\n\n"+
		"Nothing in it was stored. Correct it and put it back in %s to have it taken again.\n",
		p.cfg.Channel, name, obs.size, obs.mtime.UTC().Format(time.RFC3339), p.cfg.Now().UTC().Format(time.RFC3339), why, p.in.Directory)
	if err := os.WriteFile(dst+".error.txt", []byte(note), 0o640); err != nil {
		p.cfg.Logger.ErrorContext(ctx, "file moved to error_dir, but its note could not be written", "file", name, "to", dst, "reason", why, "error", err)
	}
	delete(p.seen, name)
	delete(p.failing, name)
	p.cfg.Logger.WarnContext(ctx, "file is not HL7 (or not wholly); moved to error_dir, nothing of it stored",
		"file", name, "size", obs.size, "to", dst, "reason", why)
}

// fail logs a problem with a file once, until it changes.
func (p *Poller) fail(ctx context.Context, name, msg string, err error, args ...any) {
	key := msg + ": " + err.Error()
	if p.failing[name] == key {
		return
	}
	p.failing[name] = key
	p.cfg.Logger.ErrorContext(ctx, msg, append([]any{"file", name, "error", err}, args...)...)
}

// moveAside moves src into dir under name, or name.tag when dir already
// has a name, and returns where it went. Across file systems it copies,
// syncs and removes.
func moveAside(src, dir, name, tag string) (string, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return "", err
	}
	dst := filepath.Join(dir, name)
	if _, err := os.Lstat(dst); err == nil {
		dst = filepath.Join(dir, name+"."+tag)
	}
	err := os.Rename(src, dst)
	if errors.Is(err, syscall.EXDEV) {
		err = copyThenRemove(src, dst)
	}
	if err != nil {
		return "", err
	}
	return dst, nil
}

func copyThenRemove(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		os.Remove(dst)
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		os.Remove(dst)
		return err
	}
	if err := out.Close(); err != nil {
		os.Remove(dst)
		return err
	}
	return os.Remove(src)
}
