package crypt

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"hash"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// EnvKeys is the environment variable that holds the keyring.
const EnvKeys = "MEFOR_ENCRYPTION_KEYS"

// KeySize is the length of every key: AES-256.
const KeySize = 32

// maxIDLen bounds a key id; it is stored in every sealed value.
const maxIDLen = 32

// keyHint is the fix every key error from variable name ends with.
func keyHint(name string) string {
	return "each entry is id=base64 of 32 random bytes, the active key first, e.g. " +
		name + "=k2=<new key>,k1=<old key>; make a key with: head -c 32 /dev/urandom | base64"
}

// Keyring is the set of keys values are sealed and opened with. The zero
// value is not usable; a nil *Keyring means encryption is off: Seal returns
// its input, and Open returns plaintext as it is and refuses sealed values,
// naming their key. A Keyring is safe for concurrent use.
type Keyring struct {
	active *key
	byID   map[string]*key
	ids    []string // as given, active first
	// refuse is shared by every copy of the keyring a node hands out, so
	// one RefuseUnbound reaches all its readers; nil never refuses.
	refuse *atomic.Bool
}

// key is one keyring entry. Only derived keys are kept, never the key as
// given: seal derives each value's AES key, blind the blind index key.
type key struct {
	id    string
	seal  sync.Pool // of hash.Hash: HMAC-SHA256 under the seal derivation key
	blind sync.Pool // of hash.Hash: HMAC-SHA256 under the blind index key
}

func newKey(id string, material []byte) *key {
	k := &key{id: id}
	sealKey := derive(material, "mefor seal v1")
	blindKey := derive(material, "mefor blind index v1")
	k.seal.New = func() any { return hmac.New(sha256.New, sealKey) }
	k.blind.New = func() any { return hmac.New(sha256.New, blindKey) }
	return k
}

// derive is HMAC-SHA256(material, label): a key for one purpose, so the
// material itself is used for nothing directly.
func derive(material []byte, label string) []byte {
	m := hmac.New(sha256.New, material)
	m.Write([]byte(label))
	return m.Sum(nil)
}

// mac computes HMAC(pool's key, parts...) into dst.
func mac(p *sync.Pool, dst []byte, parts ...[]byte) []byte {
	h := p.Get().(hash.Hash)
	h.Reset()
	for _, b := range parts {
		h.Write(b)
	}
	dst = h.Sum(dst)
	p.Put(h)
	return dst
}

// FromEnv reads the keyring from MEFOR_ENCRYPTION_KEYS through lookup (as
// os.LookupEnv). Unset or empty means encryption is off: a nil Keyring.
func FromEnv(lookup func(string) (string, bool)) (*Keyring, error) {
	spec, _ := lookup(EnvKeys)
	return Parse(spec)
}

// Parse reads a keyring in MEFOR_ENCRYPTION_KEYS's format. "" is no keyring
// (nil, nil). Errors name the entry and its key id, never key material.
func Parse(spec string) (*Keyring, error) { return ParseFrom(EnvKeys, spec) }

// ParseFrom is Parse for a keyring read from the environment variable name
// (a config may name another one than MEFOR_ENCRYPTION_KEYS); errors name
// that variable.
func ParseFrom(name, spec string) (*Keyring, error) {
	keyHint := keyHint(name)
	if spec == "" {
		return nil, nil
	}
	kr := &Keyring{byID: map[string]*key{}, refuse: new(atomic.Bool)}
	n := 0
	for i, entry := range strings.Split(spec, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		n++
		where := fmt.Sprintf("%s: entry %d", name, i+1)
		id, b64, ok := strings.Cut(entry, "=")
		if !ok || strings.Trim(b64, "= ") == "" {
			// A bare key (its base64 padding looks like "id="): never echo it.
			return nil, fmt.Errorf("%s is not id=key (it has no '='); %s", where, keyHint)
		}
		id = strings.TrimSpace(id)
		if !validID(id) {
			return nil, fmt.Errorf("%s: the key id before '=' must be 1 to %d letters, digits, '-' or '_'; %s",
				where, maxIDLen, keyHint)
		}
		where = fmt.Sprintf("%s (key id %q)", where, id)
		if _, dup := kr.byID[id]; dup {
			return nil, fmt.Errorf("%s: key id %q appears twice; give each key its own id; %s", where, id, keyHint)
		}
		material, err := decodeKey(strings.TrimSpace(b64))
		if err != nil {
			return nil, fmt.Errorf("%s: the key is not valid base64; %s", where, keyHint)
		}
		if len(material) != KeySize {
			return nil, fmt.Errorf("%s: the key is %d bytes once decoded, want %d (AES-256); %s",
				where, len(material), KeySize, keyHint)
		}
		k := newKey(id, material)
		clear(material)
		kr.byID[id] = k
		kr.ids = append(kr.ids, id)
		if kr.active == nil {
			kr.active = k
		}
	}
	if n == 0 {
		return nil, fmt.Errorf("%s is set but holds no key; unset it to run without encryption, or %s", name, keyHint)
	}
	return kr, nil
}

func decodeKey(s string) ([]byte, error) {
	if b, err := base64.StdEncoding.DecodeString(s); err == nil {
		return b, nil
	}
	return base64.RawStdEncoding.DecodeString(s)
}

func validID(id string) bool {
	if id == "" || len(id) > maxIDLen {
		return false
	}
	for _, c := range []byte(id) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// RefuseUnbound makes Open and OpenString refuse, with an *UnboundError,
// a value that is plaintext or sealed in the legacy column-bound form
// (mfe1), instead of reading it: set once `mefor keys rotate` has sealed
// every such value, after which one can only have been written outside
// mefor. Reseal still reads them. It changes every reader of kr at once.
func (kr *Keyring) RefuseUnbound(on bool) {
	if kr != nil && kr.refuse != nil {
		kr.refuse.Store(on)
	}
}

// RefusesUnbound reports whether kr refuses plaintext and legacy values.
func (kr *Keyring) RefusesUnbound() bool { return kr.refusesUnbound() }

func (kr *Keyring) refusesUnbound() bool {
	return kr != nil && kr.refuse != nil && kr.refuse.Load()
}

// lenient is kr reading plaintext and legacy values whatever RefuseUnbound
// says: what rotation, which seals them, reads with.
func (kr *Keyring) lenient() *Keyring {
	if kr == nil || kr.refuse == nil {
		return kr
	}
	c := *kr
	c.refuse = nil
	return &c
}

// Enabled reports whether values are sealed.
func (kr *Keyring) Enabled() bool { return kr != nil }

// ActiveID is the id of the key new values are sealed under; "" when off.
func (kr *Keyring) ActiveID() string {
	if kr == nil {
		return ""
	}
	return kr.active.id
}

// IDs lists the key ids, active first.
func (kr *Keyring) IDs() []string {
	if kr == nil {
		return nil
	}
	return append([]string(nil), kr.ids...)
}

// Has reports whether the keyring holds key id.
func (kr *Keyring) Has(id string) bool {
	if kr == nil {
		return false
	}
	_, ok := kr.byID[id]
	return ok
}

// String names the keys, never their material, so a keyring that ends up
// in a log line or an error shows only ids.
func (kr *Keyring) String() string {
	if kr == nil {
		return "encryption off"
	}
	return fmt.Sprintf("keyring (active %s; keys %s)", kr.active.id, strings.Join(kr.ids, ", "))
}

// SameKeys reports whether kr and o hold the same keys under the same ids,
// in the same order (so the same active key). Key material is not kept,
// so keys are compared by a blind index each derives.
func (kr *Keyring) SameKeys(o *Keyring) bool {
	if kr == nil || o == nil {
		return kr == o
	}
	const probe = "mefor keyring identity"
	return slices.Equal(kr.ids, o.ids) && slices.Equal(kr.BlindIndexes(probe, probe), o.BlindIndexes(probe, probe))
}

// GoString keeps %#v from printing the derived keys.
func (kr *Keyring) GoString() string { return kr.String() }

// LogValue keeps a logged keyring to its ids.
func (kr *Keyring) LogValue() slog.Value { return slog.StringValue(kr.String()) }
