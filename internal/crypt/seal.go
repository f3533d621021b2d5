package crypt

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// Column names where a value lives, as "table.column". It is part of every
// sealed value's authenticated data, so a value opens only in its column.
type Column string

// Row names the row a value belongs to (for message content, its message:
// "message 42"). It is part of the authenticated data of every value sealed
// by this release (envelope mfe2), so a value copied onto another row does
// not open there. Each table's owner says what names its rows.
type Row string

// Envelope layout (see the package doc).
const (
	// binStem starts every sealed bytea value, of either version; legacy
	// HL7 starts with "MSH".
	binStem = "\x00mfe"
	// binMagic starts a bytea value sealed by this release (row-bound),
	// binMagicV1 one sealed by earlier releases (column-bound only).
	binMagic   = binStem + "2"
	binMagicV1 = binStem + "1"
	// textPrefix starts a sealed text value, textPrefixV1 a legacy one.
	textPrefix   = "mfe2:"
	textPrefixV1 = "mfe1:"

	nonceSize = 24 // 12 derive the value's key, 12 are its GCM nonce
	tagSize   = 16
)

var errOff = errors.New("encryption is off: set " + EnvKeys)

// Overhead is how many bytes sealing adds to a bytea value under key id.
func Overhead(id string) int { return len(binMagic) + 1 + len(id) + nonceSize + tagSize }

// MissingKeyError is a sealed value whose key the keyring does not hold.
type MissingKeyError struct {
	Column Column
	KeyID  string
}

func (e *MissingKeyError) Error() string {
	return fmt.Sprintf("a value in %s is sealed under key %q, which %s does not hold; add that key back "+
		"(mefor keys status lists what each key still seals)", e.Column, e.KeyID, EnvKeys)
}

// OpenError is a sealed value that does not open under the key it names:
// altered, cut short, or moved from another column or row.
type OpenError struct {
	Column Column
	KeyID  string
}

func (e *OpenError) Error() string {
	if e.KeyID == "" {
		return fmt.Sprintf("a value in %s has a damaged encryption envelope", e.Column)
	}
	return fmt.Sprintf("a value in %s does not open under key %q: it was altered, copied from another row or column, "+
		"or %q is not the key it was sealed with", e.Column, e.KeyID, e.KeyID)
}

// UnboundError is a value a keyring that refuses unbound values
// (RefuseUnbound) will not read: plaintext, or a legacy envelope bound to
// its column only. Either can have been written or copied there by anyone
// who can write the table.
type UnboundError struct {
	Column Column
	// Legacy is true for a legacy (mfe1) envelope, false for plaintext.
	Legacy bool
}

func (e *UnboundError) Error() string {
	what := "is not sealed (plaintext)"
	if e.Legacy {
		what = "is sealed in the legacy form bound to its column only (mfe1)"
	}
	return fmt.Sprintf("a value in %s %s, and this store refuses such values since `mefor keys rotate` sealed them all: "+
		"it was written or copied there outside mefor", e.Column, what)
}

// IsTampered reports whether err is a value that must not be used because
// it may have been altered, moved or written outside mefor (an *OpenError
// or *UnboundError), as opposed to one whose key is missing, which adding
// the key fixes.
func IsTampered(err error) bool {
	var oe *OpenError
	var ue *UnboundError
	return errors.As(err, &oe) || errors.As(err, &ue)
}

// BinaryPrefix is how every sealed bytea value begins, of either envelope
// version, for SQL that must tell sealed values from plaintext without
// opening them. The byte after it is the version; the layout after that is
// the same for both.
func BinaryPrefix() []byte { return []byte(binStem) }

// BinaryMagic is how a bytea value sealed by this release (row-bound)
// begins, and TextMagic a text envelope: what a value not yet re-sealed
// into the row-bound form lacks.
func BinaryMagic() []byte { return []byte(binMagic) }

// TextMagic is how a text envelope sealed by this release begins.
func TextMagic() string { return textPrefix }

// TextPattern is a POSIX regular expression matching the start of every
// text envelope, of either version, with the key id as its one group.
func TextPattern() string { return `mfe[12]:([^:]*):` }

// BinaryHeader is how a bytea value sealed by this release under key id
// begins.
func BinaryHeader(id string) []byte {
	return append(append([]byte(binMagic), byte(len(id))), id...)
}

// TextHeader is how the envelope of a text value sealed by this release
// under key id begins.
func TextHeader(id string) string { return textPrefix + id + ":" }

// Sealed reports whether a bytea value is sealed (either version), and
// under which key id.
func Sealed(v []byte) (id string, ok bool) {
	id, _, _, ok = splitBin(v)
	return id, ok
}

// SealedString reports whether a text value is sealed (either version), and
// under which key id. A text value may begin with clear text that SQL put
// in front of a sealed value ("attempt 3: " before a sealed error): the
// envelope is the value's tail.
func SealedString(s string) (id string, ok bool) {
	i, p := findEnvelope(s)
	if i < 0 {
		return "", false
	}
	id, _, ok = strings.Cut(s[i+len(p):], ":")
	return id, ok
}

// findEnvelope is where the text envelope of s starts and its prefix; -1
// when s holds none.
func findEnvelope(s string) (int, string) {
	i, j := strings.Index(s, textPrefix), strings.Index(s, textPrefixV1)
	switch {
	case i >= 0 && (j < 0 || i < j):
		return i, textPrefix
	case j >= 0:
		return j, textPrefixV1
	}
	return -1, ""
}

// splitBin returns the key id and the rest (nonce, ciphertext) of a sealed
// bytea value, and whether it is a legacy (mfe1) one. A value that has the
// magic but no room for its id counts as sealed with an empty id, so it
// fails to open rather than passing as plaintext.
func splitBin(v []byte) (id string, rest []byte, legacy, ok bool) {
	if len(v) < len(binMagic) {
		return "", nil, false, false
	}
	switch string(v[:len(binMagic)]) {
	case binMagic:
	case binMagicV1:
		legacy = true
	default:
		return "", nil, false, false
	}
	v = v[len(binMagic):]
	if len(v) < 1 || len(v) < 1+int(v[0]) {
		return "", nil, legacy, true
	}
	n := int(v[0])
	return string(v[1 : 1+n]), v[1+n:], legacy, true
}

// Seal seals plain for col and row under the active key. nil stays nil (a
// NULL column stays NULL); with encryption off plain is returned as it is.
func (kr *Keyring) Seal(col Column, row Row, plain []byte) []byte {
	if kr == nil || plain == nil {
		return plain
	}
	k := kr.active
	out := make([]byte, 0, Overhead(k.id)+len(plain))
	out = append(out, binMagic...)
	out = append(out, byte(len(k.id)))
	out = append(out, k.id...)
	header := len(out)
	out = out[:header+nonceSize]
	rand.Read(out[header:]) // never fails (crypto/rand)
	nonce := out[header : header+nonceSize]
	aead := k.aead(nonce[:12])
	return aead.Seal(out, nonce[12:], plain, aad(out[:header], col, row, false))
}

// SealString seals a text value for col and row. "" stays "" (kept NULL by
// the NULLIF the writers use); with encryption off s is returned as it is.
func (kr *Keyring) SealString(col Column, row Row, s string) string {
	if kr == nil || s == "" {
		return s
	}
	k := kr.active
	header := textPrefix + k.id + ":"
	buf := make([]byte, nonceSize, nonceSize+len(s)+tagSize)
	rand.Read(buf)
	aead := k.aead(buf[:12])
	buf = aead.Seal(buf, buf[12:nonceSize], []byte(s), aad([]byte(header), col, row, false))
	return header + base64.StdEncoding.EncodeToString(buf)
}

// Open returns the plaintext of a bytea value of col in row: a sealed value
// opened under its key, legacy plaintext as it is (unless the keyring
// refuses unbound values). A value whose key is missing is a
// *MissingKeyError, one that does not open (altered, or sealed for another
// row or column) an *OpenError, one refused as unbound an *UnboundError;
// none ever returns bytes.
func (kr *Keyring) Open(col Column, row Row, v []byte) ([]byte, error) {
	id, rest, legacy, ok := splitBin(v)
	if !ok {
		if kr.refusesUnbound() && v != nil {
			return nil, &UnboundError{Column: col}
		}
		return v, nil
	}
	if id == "" {
		return nil, &OpenError{Column: col}
	}
	k, err := kr.key(col, id)
	if err != nil {
		return nil, err
	}
	if legacy && kr.refusesUnbound() {
		return nil, &UnboundError{Column: col, Legacy: true}
	}
	if len(rest) < nonceSize+tagSize {
		return nil, &OpenError{Column: col, KeyID: id}
	}
	header := v[:len(v)-len(rest)]
	plain, err := k.aead(rest[:12]).Open(nil, rest[12:nonceSize], rest[nonceSize:], aad(header, col, row, legacy))
	if err != nil {
		return nil, &OpenError{Column: col, KeyID: id}
	}
	if plain == nil {
		plain = []byte{}
	}
	return plain, nil
}

// OpenString is Open for a text value: clear text before the envelope is
// kept as it is, and the envelope replaced by its plaintext.
func (kr *Keyring) OpenString(col Column, row Row, s string) (string, error) {
	i, _ := findEnvelope(s)
	if i < 0 {
		if kr.refusesUnbound() && s != "" {
			return "", &UnboundError{Column: col}
		}
		return s, nil
	}
	plain, err := kr.openEnvelope(col, row, s[i:])
	if err != nil {
		return "", err
	}
	return s[:i] + plain, nil
}

// openEnvelope opens a text envelope, s starting with either prefix.
func (kr *Keyring) openEnvelope(col Column, row Row, s string) (string, error) {
	prefix, legacy := textPrefix, strings.HasPrefix(s, textPrefixV1)
	if legacy {
		prefix = textPrefixV1
	}
	id, _, ok := strings.Cut(s[len(prefix):], ":")
	if !ok {
		return "", &OpenError{Column: col}
	}
	k, err := kr.key(col, id)
	if err != nil {
		return "", err
	}
	if legacy && kr.refusesUnbound() {
		return "", &UnboundError{Column: col, Legacy: true}
	}
	header := prefix + id + ":"
	buf, err := base64.StdEncoding.DecodeString(s[len(header):])
	if err != nil || len(buf) < nonceSize+tagSize {
		return "", &OpenError{Column: col, KeyID: id}
	}
	plain, err := k.aead(buf[:12]).Open(nil, buf[12:nonceSize], buf[nonceSize:], aad([]byte(header), col, row, legacy))
	if err != nil {
		return "", &OpenError{Column: col, KeyID: id}
	}
	return string(plain), nil
}

// Reseal opens v and seals it under the active key, bound to row, for
// rotation. A value already sealed by this release under the active key is
// returned unchanged with changed false; plaintext and legacy values are
// sealed, whatever the keyring refuses.
func (kr *Keyring) Reseal(col Column, row Row, v []byte) (out []byte, changed bool, err error) {
	if kr == nil {
		return nil, false, errOff
	}
	if _, _, legacy, ok := splitBin(v); ok && !legacy && hasActive(kr, v) {
		return v, false, nil
	}
	plain, err := kr.lenient().Open(col, row, v)
	if err != nil {
		return nil, false, err
	}
	return kr.Seal(col, row, plain), true, nil
}

// hasActive reports whether a sealed bytea value names the active key.
func hasActive(kr *Keyring, v []byte) bool {
	id, _ := Sealed(v)
	return id == kr.active.id
}

// ResealString is Reseal for a text value; clear text before an envelope
// stays in clear.
func (kr *Keyring) ResealString(col Column, row Row, s string) (out string, changed bool, err error) {
	if kr == nil {
		return "", false, errOff
	}
	i, p := findEnvelope(s)
	if i < 0 {
		return kr.SealString(col, row, s), s != "", nil
	}
	if id, _ := SealedString(s); id == kr.active.id && p == textPrefix {
		return s, false, nil
	}
	plain, err := kr.lenient().openEnvelope(col, row, s[i:])
	if err != nil {
		return "", false, err
	}
	return s[:i] + kr.SealString(col, row, plain), true, nil
}

func (kr *Keyring) key(col Column, id string) (*key, error) {
	if kr == nil {
		return nil, &MissingKeyError{Column: col, KeyID: id}
	}
	k, ok := kr.byID[id]
	if !ok {
		return nil, &MissingKeyError{Column: col, KeyID: id}
	}
	return k, nil
}

// aead is the GCM of the one-value key derived from salt.
func (k *key) aead(salt []byte) cipher.AEAD {
	var buf [32]byte
	sub := mac(&k.seal, buf[:0], salt)
	block, err := aes.NewCipher(sub)
	clear(buf[:])
	if err != nil {
		panic(err) // a 32-byte key is always valid
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	return aead
}

// aad is the authenticated data: the envelope header, then the column, and
// for this release's envelopes the row. A legacy (mfe1) value's is the
// header and the column only, as the release that sealed it wrote it.
func aad(header []byte, col Column, row Row, legacy bool) []byte {
	out := make([]byte, 0, len(header)+2+len(col)+len(row))
	out = append(out, header...)
	out = append(out, 0)
	out = append(out, col...)
	if legacy {
		return out
	}
	out = append(out, 0)
	return append(out, row...)
}
