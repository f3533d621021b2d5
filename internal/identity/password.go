package identity

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"golang.org/x/crypto/argon2"
)

// Argon2Params are argon2id's cost parameters. They are stored in every
// hash, so raising them later keeps old hashes verifying.
type Argon2Params struct {
	// Time is the number of passes. Defaults to 3.
	Time uint32
	// MemoryKiB is the memory each hash takes. Defaults to 64 MiB.
	MemoryKiB uint32
	// Threads is the parallelism. Defaults to 4.
	Threads uint8
}

// DefaultArgon2 are RFC 9106's second recommended parameters (t=3,
// m=64 MiB, p=4), for hosts that cannot give each login 2 GiB: about
// 50-100 ms per hash on a server core.
var DefaultArgon2 = Argon2Params{Time: 3, MemoryKiB: 64 * 1024, Threads: 4}

const (
	argonSaltLen = 16
	argonKeyLen  = 32
	// MinPasswordLength is the shortest password accepted, in characters.
	MinPasswordLength = 12
	// maxPasswordLength bounds the work one login can ask for.
	maxPasswordLength = 1024
)

var b64 = base64.RawStdEncoding

// HashPassword hashes password with argon2id under a fresh random salt, as
// a PHC string: $argon2id$v=19$m=65536,t=3,p=4$<salt>$<hash>, base64
// without padding.
func HashPassword(p Argon2Params, password string) (string, error) {
	salt := make([]byte, argonSaltLen)
	if _, err := rand.Read(salt); err != nil {
		return "", fmt.Errorf("password salt: %w", err)
	}
	key := argon2.IDKey([]byte(password), salt, p.Time, p.MemoryKiB, p.Threads, argonKeyLen)
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s", argon2.Version, p.MemoryKiB, p.Time, p.Threads,
		b64.EncodeToString(salt), b64.EncodeToString(key)), nil
}

var errBadHash = errors.New("stored password hash is not an argon2id PHC string")

// VerifyPassword reports whether password matches the PHC string encoded,
// hashing it under the parameters the string names and comparing in
// constant time.
func VerifyPassword(encoded, password string) (bool, error) {
	parts := strings.Split(encoded, "$")
	if len(parts) != 6 || parts[1] != "argon2id" {
		return false, errBadHash
	}
	var version int
	if _, err := fmt.Sscanf(parts[2], "v=%d", &version); err != nil || version != argon2.Version {
		return false, errBadHash
	}
	var p Argon2Params
	if _, err := fmt.Sscanf(parts[3], "m=%d,t=%d,p=%d", &p.MemoryKiB, &p.Time, &p.Threads); err != nil ||
		p.Time == 0 || p.MemoryKiB == 0 || p.Threads == 0 {
		return false, errBadHash
	}
	salt, err := b64.DecodeString(parts[4])
	if err != nil {
		return false, errBadHash
	}
	want, err := b64.DecodeString(parts[5])
	if err != nil || len(want) == 0 {
		return false, errBadHash
	}
	got := argon2.IDKey([]byte(password), salt, p.Time, p.MemoryKiB, p.Threads, uint32(len(want)))
	return subtle.ConstantTimeCompare(got, want) == 1, nil
}

// CheckPassword refuses a password too short, too long, or equal to the
// user name (ignoring case and surrounding space). The error names the
// field, never the password.
func CheckPassword(name, password string) error {
	n := utf8.RuneCountInString(password)
	switch {
	case n < MinPasswordLength:
		return &InvalidError{Field: "password", Reason: fmt.Sprintf("must be at least %d characters", MinPasswordLength)}
	case n > maxPasswordLength:
		return &InvalidError{Field: "password", Reason: fmt.Sprintf("must be at most %d characters", maxPasswordLength)}
	case strings.EqualFold(strings.TrimSpace(password), name):
		return &InvalidError{Field: "password", Reason: "must not be the user name"}
	}
	return nil
}
