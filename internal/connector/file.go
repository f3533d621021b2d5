package connector

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/mefor/mefor/internal/config"
)

// maxSuffix bounds the suffixes tried for a name already taken, so a
// directory full of one control id's files ends in a dead letter, not a
// loop.
const maxSuffix = 999

// FileSender writes each message to its own file, atomically and never
// over another file: the message is written to a temp file created
// exclusively, then linked to its name, which fails rather than replace
// anything there (a file, or a symlink someone planted). A name already
// taken gets a suffix (C1.hl7, then C1.1.hl7, C1.2.hl7, ...). A reader never
// sees a half-written file, and a crash leaves at most a temp file behind.
// Directories under the destination's directory are opened without
// following symlinks, so a planted symlink cannot lead a message outside it.
type FileSender struct {
	dest *config.FileDestination
}

// errBadName marks a failure of the name itself, which no retry can cure.
var errBadName = errors.New("file name cannot be written")

// Send writes one file. A name that cannot be written (too long, a symlink
// or file where a directory must be, no free suffix) is OutcomeBadName, so
// the row is dead-lettered at once instead of blocking its lane. Neither
// outcome's description holds the name: it may carry the sender's MSH-10.
func (s *FileSender) Send(_ context.Context, d Delivery) Result {
	name, err := s.dest.Name(config.FileNameData{
		MessageID:   strconv.FormatInt(d.MessageID, 10),
		ControlID:   d.ControlID,
		Channel:     d.Channel,
		MessageType: d.MessageType,
		Destination: d.Destination,
		Seq:         d.Seq,
		Received:    d.Received,
	})
	if err != nil {
		return Result{Outcome: OutcomeBadName, Error: fmt.Sprintf("%s: file name: %v", OutcomeBadName, err)}
	}
	if err := writeNew(s.dest.Directory, name, d.Payload); err != nil {
		if errors.Is(err, errBadName) {
			return Result{Outcome: OutcomeBadName, Error: fmt.Sprintf("%s: in %s: %v", OutcomeBadName, s.dest.Directory, err)}
		}
		return Result{Outcome: OutcomeIOError, Error: fmt.Sprintf("%s: in %s: %v", OutcomeIOError, s.dest.Directory, err)}
	}
	return Result{OK: true, Outcome: OutcomeDelivered}
}

// Close does nothing: files are closed as they are written.
func (s *FileSender) Close() error { return nil }

// writeNew writes data to the file name (relative, local) under dir
// without replacing any existing file, adding a suffix when name is taken.
// Errors name neither the file nor its data.
func writeNew(dir, name string, data []byte) error {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("create directory: %w", bareErr(err))
	}
	parent, err := openDirNoFollow(dir, filepath.Dir(name))
	if err != nil {
		return err
	}
	defer parent.Close()

	base := filepath.Base(name)
	tmp, err := writeTemp(parent, data)
	if err != nil {
		return err
	}
	defer removeAt(parent, tmp) // linked under its name by now, or failed
	for n := 0; n <= maxSuffix; n++ {
		err := linkAt(parent, tmp, suffixed(base, n))
		switch {
		case err == nil:
			return nil
		case errors.Is(err, syscall.EEXIST):
			continue
		case isNameErr(err):
			return fmt.Errorf("%w: %w", errBadName, err)
		default:
			return fmt.Errorf("link into place: %w", err)
		}
	}
	return fmt.Errorf("%w: the name and its %d suffixes are taken", errBadName, maxSuffix)
}

// suffixed returns base with the n-th suffix before its extension: n = 0
// is base itself.
func suffixed(base string, n int) string {
	if n == 0 {
		return base
	}
	ext := filepath.Ext(base)
	stem := strings.TrimSuffix(base, ext)
	if stem == "" { // ".hl7": a name that is all extension
		return base + "." + strconv.Itoa(n)
	}
	return stem + "." + strconv.Itoa(n) + ext
}

// tempName is a fresh hidden name: file sources never take names starting
// with a dot, so a half-written file is not picked up by another mefor.
func tempName() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails
	return ".mefor-" + hex.EncodeToString(b[:]) + ".tmp"
}

// isNameErr says whether err is about the name or the path to it rather
// than the disk: retrying the same name would fail the same way.
func isNameErr(err error) bool {
	for _, e := range []error{syscall.ENAMETOOLONG, syscall.ELOOP, syscall.ENOTDIR, syscall.EINVAL, syscall.EISDIR, syscall.EILSEQ} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// bareErr drops the path from an *os.PathError or *os.LinkError: it may
// hold a sender's field.
func bareErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return fmt.Errorf("%s: %w", le.Op, le.Err)
	}
	return err
}

// fillTemp writes data to f, the temp file name just created in parent,
// flushes it to disk and closes it; on failure it removes the file.
func fillTemp(parent, f *os.File, name string, data []byte) error {
	_, err := f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		removeAt(parent, name)
		return fmt.Errorf("write temp file: %w", bareErr(err))
	}
	return nil
}
