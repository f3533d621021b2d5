package identity

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/pquerna/otp"
	"github.com/pquerna/otp/totp"
)

// TOTP as authenticator apps expect it (RFC 6238): 30-second steps, six
// digits, HMAC-SHA1.
const (
	totpPeriod = 30
	totpIssuer = "mefor"
	// RecoveryCodes is how many single-use recovery codes an enrollment
	// prints.
	RecoveryCodes = 10
)

var totpOpts = totp.ValidateOpts{Period: totpPeriod, Digits: otp.DigitsSix, Algorithm: otp.AlgorithmSHA1}

// Enrollment is what a user needs to set up the second factor, shown once:
// the otpauth:// URI for an authenticator app (a QR code of it) and the
// recovery codes.
type Enrollment struct {
	TOTPURI       string   `json:"totp_uri"`
	RecoveryCodes []string `json:"recovery_codes"`
}

// newTOTP draws a TOTP secret for user name.
func newTOTP(name string) (secret, uri string, err error) {
	key, err := totp.Generate(totp.GenerateOpts{Issuer: totpIssuer, AccountName: name, Period: totpPeriod,
		Digits: otp.DigitsSix, Algorithm: otp.AlgorithmSHA1})
	if err != nil {
		return "", "", fmt.Errorf("new TOTP secret: %w", err)
	}
	return key.Secret(), key.URL(), nil
}

// TOTPCode is the code of secret at t (for tests and scripts that log in).
func TOTPCode(secret string, t time.Time) (string, error) {
	return totp.GenerateCodeCustom(secret, t, totpOpts)
}

// totpStep matches code against the steps around now (one step of clock
// skew each way) that come after lastStep, and returns the step it
// belongs to. A code of lastStep or before is refused: each works once.
func totpStep(secret, code string, now time.Time, lastStep int64) (int64, bool) {
	if len(code) != 6 {
		return 0, false
	}
	cur := now.Unix() / totpPeriod
	for step := cur - 1; step <= cur+1; step++ {
		want, err := totp.GenerateCodeCustom(secret, time.Unix(step*totpPeriod, 0), totpOpts)
		if err != nil {
			return 0, false
		}
		if subtle.ConstantTimeCompare([]byte(want), []byte(code)) == 1 {
			if step <= lastStep {
				return 0, false
			}
			return step, true
		}
	}
	return 0, false
}

// isTOTPCode tells a six-digit code from a recovery code.
func isTOTPCode(s string) bool {
	if len(s) != 6 {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

var codeEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// newRecoveryCodes draws RecoveryCodes codes of 80 random bits each,
// written xxxx-xxxx-xxxx-xxxx, and their hashes.
func newRecoveryCodes() (codes, hashes []string, err error) {
	for range RecoveryCodes {
		b := make([]byte, 10)
		if _, err := rand.Read(b); err != nil {
			return nil, nil, fmt.Errorf("recovery code: %w", err)
		}
		s := strings.ToLower(codeEncoding.EncodeToString(b))
		code := s[0:4] + "-" + s[4:8] + "-" + s[8:12] + "-" + s[12:16]
		codes = append(codes, code)
		hashes = append(hashes, recoveryHash(code))
	}
	return codes, hashes, nil
}

// recoveryHash is the stored form of a recovery code: SHA-256 of the code
// without dashes or spaces, in lowercase, so it may be typed either way.
func recoveryHash(code string) string {
	c := strings.ToLower(strings.NewReplacer("-", "", " ", "").Replace(strings.TrimSpace(code)))
	sum := sha256.Sum256([]byte(c))
	return hex.EncodeToString(sum[:])
}
