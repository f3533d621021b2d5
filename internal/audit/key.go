package audit

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// EnvKey is the environment variable holding the audit key: comma-separated
// id=key pairs, each key 32 random bytes in base64, the first one the key
// new anchors are signed with, the others only checking older anchors.
//
// The key proves the log to whoever holds it: the nodes (which sign the
// anchors) and whoever runs `mefor audit verify`. Keep it away from the
// database host and its administrators: a database superuser who also
// holds it can rewrite the log and sign the rewrite.
const EnvKey = "MEFOR_AUDIT_KEY"

// Keys are the audit keys from MEFOR_AUDIT_KEY. A nil *Keys has no key:
// anchors are then taken unsigned and Verify checks no MAC.
type Keys struct {
	active string
	keys   map[string][]byte
}

var keyIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)

// ParseKeys reads id=base64 pairs as EnvKey holds them. Errors name the
// entry and its id, never the key.
func ParseKeys(spec string) (*Keys, error) {
	k := &Keys{keys: map[string][]byte{}}
	for i, entry := range strings.Split(spec, ",") {
		entry = strings.TrimSpace(entry)
		id, b64, ok := strings.Cut(entry, "=")
		where := fmt.Sprintf("%s: entry %d", EnvKey, i+1)
		if !ok || !keyIDRE.MatchString(id) {
			return nil, fmt.Errorf("%s: want id=key, the id 1 to 32 letters, digits, - or _ (e.g. a1=$(head -c 32 /dev/urandom | base64))", where)
		}
		where += fmt.Sprintf(" (key id %q)", id)
		raw, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			return nil, fmt.Errorf("%s: the key is not base64; make one with: head -c 32 /dev/urandom | base64", where)
		}
		if len(raw) != 32 {
			return nil, fmt.Errorf("%s: the key is %d bytes once decoded, want 32; make one with: head -c 32 /dev/urandom | base64", where, len(raw))
		}
		if _, dup := k.keys[id]; dup {
			return nil, fmt.Errorf("%s: key id %q appears twice", where, id)
		}
		if k.active == "" {
			k.active = id
		}
		k.keys[id] = raw
	}
	return k, nil
}

// KeysFromEnv reads EnvKey through lookup; unset or empty is no key (nil).
func KeysFromEnv(lookup func(string) (string, bool)) (*Keys, error) {
	spec, ok := lookup(EnvKey)
	if !ok || strings.TrimSpace(spec) == "" {
		return nil, nil
	}
	return ParseKeys(spec)
}

// ActiveID is the id new anchors are signed under ("" without keys).
func (k *Keys) ActiveID() string {
	if k == nil {
		return ""
	}
	return k.active
}

// Has reports whether k holds the key id.
func (k *Keys) Has(id string) bool {
	if k == nil {
		return false
	}
	_, ok := k.keys[id]
	return ok
}

// String names the key ids, never a key.
func (k *Keys) String() string {
	if k == nil {
		return "no audit key"
	}
	return "audit key " + k.active
}

// anchorMACVersion starts every anchor's MAC input.
const anchorMACVersion = "mefor-audit-anchor-v1"

// anchorMAC is HMAC-SHA256 under key id over the anchor's number, the
// audit row it anchors (seq and hash) and the previous anchor's MAC.
func (k *Keys) anchorMAC(id string, no, seq int64, hash, prevMAC string) string {
	m := hmac.New(sha256.New, k.keys[id])
	writeFields(m, anchorMACVersion, strconv.FormatInt(no, 10), strconv.FormatInt(seq, 10), hash, prevMAC)
	return hex.EncodeToString(m.Sum(nil))
}
