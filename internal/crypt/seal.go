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

// Envelope layout (see the package doc).
const (
	// binMagic starts a sealed bytea value; legacy HL7 starts with "MSH".
	binMagic = "\x00mfe1"
	// textPrefix starts a sealed text value.
	textPrefix = "mfe1:"

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
// altered, cut short, or moved from another column.
type OpenError struct {
	Column Column
	KeyID  string
}

func (e *OpenError) Error() string {
	if e.KeyID == "" {
		return fmt.Sprintf("a value in %s has a damaged encryption envelope", e.Column)
	}
	return fmt.Sprintf("a value in %s does not open under key %q: it was altered, moved from another column, "+
		"or %q is not the key it was sealed with", e.Column, e.KeyID, e.KeyID)
}

// BinaryPrefix is how every sealed bytea value begins, for SQL that must
// tell sealed values from plaintext without opening them.
func BinaryPrefix() []byte { return []byte(binMagic) }

// TextPrefix is how the envelope of every sealed text value begins.
func TextPrefix() string { return textPrefix }

// BinaryHeader is how a bytea value sealed under key id begins.
func BinaryHeader(id string) []byte {
	return append(append([]byte(binMagic), byte(len(id))), id...)
}

// TextHeader is how the envelope of a text value sealed under key id
// begins.
func TextHeader(id string) string { return textPrefix + id + ":" }

// Sealed reports whether a bytea value is sealed, and under which key id.
func Sealed(v []byte) (id string, ok bool) {
	id, _, ok = splitBin(v)
	return id, ok
}

// SealedString reports whether a text value is sealed, and under which key
// id. A text value may begin with clear text that SQL put in front of a
// sealed value ("attempt 3: " before a sealed error): the envelope is the
// value's tail.
func SealedString(s string) (id string, ok bool) {
	i := strings.Index(s, textPrefix)
	if i < 0 {
		return "", false
	}
	id, _, ok = strings.Cut(s[i+len(textPrefix):], ":")
	return id, ok
}

// splitBin returns the key id and the rest (nonce, ciphertext) of a sealed
// bytea value. A value that has the magic but no room for its id counts as
// sealed with an empty id, so it fails to open rather than passing as
// plaintext.
func splitBin(v []byte) (id string, rest []byte, ok bool) {
	if len(v) < len(binMagic) || string(v[:len(binMagic)]) != binMagic {
		return "", nil, false
	}
	v = v[len(binMagic):]
	if len(v) < 1 || len(v) < 1+int(v[0]) {
		return "", nil, true
	}
	n := int(v[0])
	return string(v[1 : 1+n]), v[1+n:], true
}

// Seal seals plain for col under the active key. nil stays nil (a NULL
// column stays NULL); with encryption off plain is returned as it is.
func (kr *Keyring) Seal(col Column, plain []byte) []byte {
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
	return aead.Seal(out, nonce[12:], plain, aad(out[:header], col))
}

// SealString seals a text value for col. "" stays "" (kept NULL by the
// NULLIF the writers use); with encryption off s is returned as it is.
func (kr *Keyring) SealString(col Column, s string) string {
	if kr == nil || s == "" {
		return s
	}
	k := kr.active
	header := textPrefix + k.id + ":"
	buf := make([]byte, nonceSize, nonceSize+len(s)+tagSize)
	rand.Read(buf)
	aead := k.aead(buf[:12])
	buf = aead.Seal(buf, buf[12:nonceSize], []byte(s), aad([]byte(header), col))
	return header + base64.StdEncoding.EncodeToString(buf)
}

// Open returns the plaintext of a bytea value of col: a sealed value
// opened under its key, legacy plaintext as it is. A value whose key is
// missing is a *MissingKeyError, one that does not open an *OpenError;
// neither ever returns bytes.
func (kr *Keyring) Open(col Column, v []byte) ([]byte, error) {
	id, rest, ok := splitBin(v)
	if !ok {
		return v, nil
	}
	if id == "" {
		return nil, &OpenError{Column: col}
	}
	k, err := kr.key(col, id)
	if err != nil {
		return nil, err
	}
	if len(rest) < nonceSize+tagSize {
		return nil, &OpenError{Column: col, KeyID: id}
	}
	header := v[:len(v)-len(rest)]
	plain, err := k.aead(rest[:12]).Open(nil, rest[12:nonceSize], rest[nonceSize:], aad(header, col))
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
func (kr *Keyring) OpenString(col Column, s string) (string, error) {
	i := strings.Index(s, textPrefix)
	if i < 0 {
		return s, nil
	}
	plain, err := kr.openEnvelope(col, s[i:])
	if err != nil {
		return "", err
	}
	return s[:i] + plain, nil
}

// openEnvelope opens a text envelope, s starting with textPrefix.
func (kr *Keyring) openEnvelope(col Column, s string) (string, error) {
	id, _, ok := strings.Cut(s[len(textPrefix):], ":")
	if !ok {
		return "", &OpenError{Column: col}
	}
	k, err := kr.key(col, id)
	if err != nil {
		return "", err
	}
	header := textPrefix + id + ":"
	buf, err := base64.StdEncoding.DecodeString(s[len(header):])
	if err != nil || len(buf) < nonceSize+tagSize {
		return "", &OpenError{Column: col, KeyID: id}
	}
	plain, err := k.aead(buf[:12]).Open(nil, buf[12:nonceSize], buf[nonceSize:], aad([]byte(header), col))
	if err != nil {
		return "", &OpenError{Column: col, KeyID: id}
	}
	return string(plain), nil
}

// Reseal opens v and seals it under the active key, for rotation. A value
// already under the active key is returned unchanged with changed false.
func (kr *Keyring) Reseal(col Column, v []byte) (out []byte, changed bool, err error) {
	if id, ok := Sealed(v); ok && kr != nil && id == kr.active.id {
		return v, false, nil
	}
	if kr == nil {
		return nil, false, errOff
	}
	plain, err := kr.Open(col, v)
	if err != nil {
		return nil, false, err
	}
	return kr.Seal(col, plain), true, nil
}

// ResealString is Reseal for a text value; clear text before an envelope
// stays in clear.
func (kr *Keyring) ResealString(col Column, s string) (out string, changed bool, err error) {
	if kr == nil {
		return "", false, errOff
	}
	i := strings.Index(s, textPrefix)
	if i < 0 {
		return kr.SealString(col, s), s != "", nil
	}
	if id, _ := SealedString(s); id == kr.active.id {
		return s, false, nil
	}
	plain, err := kr.openEnvelope(col, s[i:])
	if err != nil {
		return "", false, err
	}
	return s[:i] + kr.SealString(col, plain), true, nil
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

// aad is the authenticated data: the envelope header, then the column.
func aad(header []byte, col Column) []byte {
	out := make([]byte, 0, len(header)+1+len(col))
	out = append(out, header...)
	out = append(out, 0)
	return append(out, col...)
}
