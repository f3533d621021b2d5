package crypt

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

const (
	colRaw   Column = "mefor_message.raw"
	colPay   Column = "mefor_work.payload"
	colError Column = "mefor_work.last_error"

	row1 Row = "message 1"
	row2 Row = "message 2"
)

// newKeyB64 returns a fresh random key, base64.
func newKeyB64(t testing.TB) string {
	t.Helper()
	b := make([]byte, KeySize)
	rand.Read(b)
	return base64.StdEncoding.EncodeToString(b)
}

func mustParse(t testing.TB, spec string) *Keyring {
	t.Helper()
	kr, err := Parse(spec)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return kr
}

func TestSealOpenRoundTrip(t *testing.T) {
	kr := mustParse(t, "k1="+newKeyB64(t))
	body := []byte("MSH|^~\\&|LAB|H|EHR|H|20250101||ADT^A01|1|P|2.5\rPID|||123456||DOE^JANE\r")

	sealed := kr.Seal(colRaw, row1, body)
	if bytes.Contains(sealed, []byte("DOE")) || bytes.Contains(sealed, []byte("123456")) {
		t.Fatal("sealed value holds plaintext")
	}
	if id, ok := Sealed(sealed); !ok || id != "k1" {
		t.Fatalf("Sealed = %q, %v; want k1, true", id, ok)
	}
	got, err := kr.Open(colRaw, row1, sealed)
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("Open = %q, %v", got, err)
	}

	s := kr.SealString(colError, row1, "patient DOE^JANE")
	if strings.Contains(s, "DOE") {
		t.Fatal("sealed text holds plaintext")
	}
	if id, ok := SealedString(s); !ok || id != "k1" {
		t.Fatalf("SealedString = %q, %v", id, ok)
	}
	if got, err := kr.OpenString(colError, row1, s); err != nil || got != "patient DOE^JANE" {
		t.Fatalf("OpenString = %q, %v", got, err)
	}

	// NULL stays NULL, "" stays "" (the writers keep it NULL), an empty
	// body is sealed and opens empty.
	if kr.Seal(colRaw, row1, nil) != nil || kr.SealString(colError, row1, "") != "" {
		t.Fatal("nil or empty was sealed")
	}
	empty, err := kr.Open(colRaw, row1, kr.Seal(colRaw, row1, []byte{}))
	if err != nil || empty == nil || len(empty) != 0 {
		t.Fatalf("empty body = %q (nil %v), %v", empty, empty == nil, err)
	}
}

func TestLegacyPlaintextReadsAsIs(t *testing.T) {
	kr := mustParse(t, "k1="+newKeyB64(t))
	for _, v := range [][]byte{[]byte("MSH|^~\\&|x"), {}, []byte("\x00mfe"), []byte("garbage \xff")} {
		got, err := kr.Open(colRaw, row1, v)
		if err != nil || !bytes.Equal(got, v) {
			t.Errorf("Open(%q) = %q, %v; want it unchanged", v, got, err)
		}
		var off *Keyring
		if got, err := off.Open(colRaw, row1, v); err != nil || !bytes.Equal(got, v) {
			t.Errorf("off: Open(%q) = %q, %v", v, got, err)
		}
	}
	if got, err := kr.OpenString(colError, row1, "attempt 2: timeout"); err != nil || got != "attempt 2: timeout" {
		t.Fatalf("OpenString = %q, %v", got, err)
	}
}

func TestEncryptionOffIsPlaintext(t *testing.T) {
	var off *Keyring
	if off.Enabled() || off.ActiveID() != "" {
		t.Fatal("nil keyring claims to encrypt")
	}
	body := []byte("MSH|x")
	if got := off.Seal(colRaw, row1, body); !bytes.Equal(got, body) {
		t.Fatalf("Seal with encryption off = %q", got)
	}
	if got := off.SealString(colError, row1, "e"); got != "e" {
		t.Fatalf("SealString with encryption off = %q", got)
	}
	if got := off.BlindIndex("patient", "123"); got != "123" {
		t.Fatalf("BlindIndex with encryption off = %q", got)
	}
	// Parse("") is encryption off, not an error.
	if kr, err := Parse(""); kr != nil || err != nil {
		t.Fatalf(`Parse("") = %v, %v`, kr, err)
	}
}

func TestClearTextBeforeASealedText(t *testing.T) {
	k1, k2 := newKeyB64(t), newKeyB64(t)
	kr := mustParse(t, "k1="+k1)
	// What SQL makes of a sealed error: format('attempt %s: %s', n, $err).
	s := "attempt 3: " + kr.SealString(colError, row1, "script threw: DOE^JANE")
	if id, ok := SealedString(s); !ok || id != "k1" {
		t.Fatalf("SealedString = %q, %v", id, ok)
	}
	if got, err := kr.OpenString(colError, row1, s); err != nil || got != "attempt 3: script threw: DOE^JANE" {
		t.Fatalf("OpenString = %q, %v", got, err)
	}
	ring := mustParse(t, "k2="+k2+",k1="+k1)
	re, changed, err := ring.ResealString(colError, row1, s)
	if err != nil || !changed || !strings.HasPrefix(re, "attempt 3: mfe2:k2:") {
		t.Fatalf("ResealString = %q, %v, %v", re, changed, err)
	}
	if got, err := mustParse(t, "k2="+k2).OpenString(colError, row1, re); err != nil || got != "attempt 3: script threw: DOE^JANE" {
		t.Fatalf("after rotation: %q, %v", got, err)
	}
	if legacy, changed, _ := ring.ResealString(colError, row1, "legacy text"); !changed || !strings.HasPrefix(legacy, "mfe2:k2:") {
		t.Fatalf("legacy text resealed as %q", legacy)
	}
	if empty, changed, _ := ring.ResealString(colError, row1, ""); changed || empty != "" {
		t.Fatalf("empty text resealed as %q", empty)
	}
}

func TestValueOpensOnlyInItsColumn(t *testing.T) {
	kr := mustParse(t, "k1="+newKeyB64(t))
	sealed := kr.Seal(colRaw, row1, []byte("MSH|body"))
	_, err := kr.Open(colPay, row1, sealed)
	var oe *OpenError
	if !errors.As(err, &oe) || oe.KeyID != "k1" || oe.Column != colPay {
		t.Fatalf("Open in another column: %v; want *OpenError naming k1 and %s", err, colPay)
	}
	s := kr.SealString(colError, row1, "x")
	if _, err := kr.OpenString("mefor_event.detail", row1, s); !errors.As(err, &oe) {
		t.Fatalf("OpenString in another column: %v", err)
	}
}

func TestTamperedValueDoesNotOpen(t *testing.T) {
	k1, k2 := newKeyB64(t), newKeyB64(t)
	kr := mustParse(t, "k1="+k1+",k2="+k2)
	sealed := kr.Seal(colRaw, row1, []byte("MSH|body"))
	for i := range sealed {
		bad := bytes.Clone(sealed)
		bad[i] ^= 0x01
		got, err := kr.Open(colRaw, row1, bad)
		if err == nil {
			// Only a flip inside the magic turns it into "plaintext",
			// which is the stored bytes themselves, never a decryption.
			if i < len(binMagic) && bytes.Equal(got, bad) {
				continue
			}
			t.Fatalf("byte %d flipped: Open = %q, nil", i, got)
		}
	}
	// The key id is authenticated: relabelling k1's value as k2's fails.
	relabel := bytes.Clone(sealed)
	relabel[len(binMagic)+2] = '2'
	if _, err := kr.Open(colRaw, row1, relabel); err == nil {
		t.Fatal("value relabelled to another key opened")
	}
	// Cut short.
	if _, err := kr.Open(colRaw, row1, sealed[:len(sealed)-1]); err == nil {
		t.Fatal("truncated value opened")
	}
	if _, err := kr.Open(colRaw, row1, []byte(binMagic)); err == nil {
		t.Fatal("bare magic opened")
	}
	s := kr.SealString(colError, row1, "x")
	if _, err := kr.OpenString(colError, row1, s[:len(s)-2]+"AA"); err == nil {
		t.Fatal("tampered text opened")
	}
}

func TestMissingKeyNamesTheKeyID(t *testing.T) {
	old := mustParse(t, "old-1="+newKeyB64(t))
	sealed := old.Seal(colRaw, row1, []byte("MSH|body"))
	text := old.SealString(colError, row1, "x")

	other := mustParse(t, "new-2="+newKeyB64(t))
	var off *Keyring
	for name, kr := range map[string]*Keyring{"other key": other, "encryption off": off} {
		got, err := kr.Open(colRaw, row1, sealed)
		var mk *MissingKeyError
		if !errors.As(err, &mk) || mk.KeyID != "old-1" || got != nil {
			t.Fatalf("%s: Open = %q, %v; want no bytes and *MissingKeyError for old-1", name, got, err)
		}
		if !strings.Contains(err.Error(), `"old-1"`) || !strings.Contains(err.Error(), string(colRaw)) {
			t.Fatalf("%s: error %q does not name the key id and column", name, err)
		}
		if _, err := kr.OpenString(colError, row1, text); !errors.As(err, &mk) || mk.KeyID != "old-1" {
			t.Fatalf("%s: OpenString: %v", name, err)
		}
	}
}

func TestRotationKeepsOldValuesReadable(t *testing.T) {
	k1, k2 := newKeyB64(t), newKeyB64(t)
	before := mustParse(t, "k1="+k1)
	v1 := before.Seal(colRaw, row1, []byte("MSH|one"))
	t1 := before.SealString(colError, row1, "one")

	during := mustParse(t, "k2="+k2+", k1="+k1)
	if during.ActiveID() != "k2" {
		t.Fatalf("active = %s, want the first pair", during.ActiveID())
	}
	if got, err := during.Open(colRaw, row1, v1); err != nil || string(got) != "MSH|one" {
		t.Fatalf("old value under the new ring: %q, %v", got, err)
	}
	v2, changed, err := during.Reseal(colRaw, row1, v1)
	if err != nil || !changed {
		t.Fatalf("Reseal = changed %v, %v", changed, err)
	}
	if id, _ := Sealed(v2); id != "k2" {
		t.Fatalf("resealed under %q, want k2", id)
	}
	if _, changed, _ := during.Reseal(colRaw, row1, v2); changed {
		t.Fatal("a value under the active key was resealed")
	}
	plainV, changed, err := during.Reseal(colRaw, row1, []byte("MSH|legacy"))
	if err != nil || !changed {
		t.Fatalf("Reseal of plaintext: %v, %v", changed, err)
	}
	t2, _, err := during.ResealString(colError, row1, t1)
	if err != nil {
		t.Fatal(err)
	}

	after := mustParse(t, "k2="+k2) // k1 dropped
	for _, v := range [][]byte{v2, plainV} {
		if _, err := after.Open(colRaw, row1, v); err != nil {
			t.Fatalf("after dropping k1: %v", err)
		}
	}
	if got, err := after.OpenString(colError, row1, t2); err != nil || got != "one" {
		t.Fatalf("text after dropping k1: %q, %v", got, err)
	}
	if _, err := after.Open(colRaw, row1, v1); err == nil {
		t.Fatal("k1's value opened without k1")
	}
}

// TestNeverReusesANonceUnderOneKey seals many values under one key and
// checks that no two share their 24 random bytes (so no two share both
// their derived key and their GCM nonce), and that sealing the same
// plaintext twice never gives the same value.
func TestNeverReusesANonceUnderOneKey(t *testing.T) {
	kr := mustParse(t, "k1="+newKeyB64(t))
	n := 200_000
	if testing.Short() {
		n = 20_000
	}
	seen := make(map[[nonceSize]byte]struct{}, n)
	gcmNonces := make(map[[12]byte]struct{}, n)
	plain := []byte("MSH|same body every time")
	for i := range n {
		var v []byte
		var nonce []byte
		if i%2 == 0 {
			v = kr.Seal(colRaw, row1, plain)
			_, rest, _, _ := splitBin(v)
			nonce = rest[:nonceSize]
		} else {
			s := kr.SealString(colError, row1, "same text")
			b, err := base64.StdEncoding.DecodeString(s[len(textPrefix+"k1:"):])
			if err != nil {
				t.Fatal(err)
			}
			nonce = b[:nonceSize]
		}
		var key [nonceSize]byte
		copy(key[:], nonce)
		if _, dup := seen[key]; dup {
			t.Fatalf("seal %d reused a nonce", i)
		}
		seen[key] = struct{}{}
		var g [12]byte
		copy(g[:], nonce[12:])
		gcmNonces[g] = struct{}{}
	}
	// The GCM nonce half is random on its own too: a constant half would
	// leave the derived key as the only thing that varies.
	if len(gcmNonces) != n {
		t.Fatalf("%d distinct GCM nonces in %d seals", len(gcmNonces), n)
	}
	a, b := kr.Seal(colRaw, row1, plain), kr.Seal(colRaw, row1, plain)
	if bytes.Equal(a, b) {
		t.Fatal("two seals of one plaintext are equal")
	}
}

func TestBlindIndex(t *testing.T) {
	k1, k2 := newKeyB64(t), newKeyB64(t)
	kr := mustParse(t, "k1="+k1)
	a := kr.BlindIndex("patient", "123456")
	if a == "123456" || strings.Contains(a, "123456") {
		t.Fatalf("blind index %q holds the value", a)
	}
	if kr.BlindIndex("patient", "123456") != a {
		t.Fatal("blind index is not deterministic")
	}
	if kr.BlindIndex("patient", "123457") == a || kr.BlindIndex("state", "123456") == a {
		t.Fatal("blind index ignores the value or the purpose")
	}
	if id, ok := BlindKeyID(a); !ok || id != "k1" {
		t.Fatalf("BlindKeyID = %q, %v", id, ok)
	}
	other := mustParse(t, "k1="+k2)
	if other.BlindIndex("patient", "123456") == a {
		t.Fatal("two keys give one blind index")
	}
	ring := mustParse(t, "k2="+k2+",k1="+k1)
	all := ring.BlindIndexes("patient", "123456")
	if len(all) != 2 || all[1] != a || all[0] != ring.BlindIndex("patient", "123456") {
		t.Fatalf("BlindIndexes = %v; want the active key's, then k1's %q", all, a)
	}
}

func TestMalformedKeysAreRefusedWithoutShowingThem(t *testing.T) {
	good := newKeyB64(t)
	short := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef")) // 16 bytes
	long := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("k"), 48))
	cases := []struct {
		name, spec, want string
		secret           string // must not appear in the error
	}{
		{"no equals", good, "entry 1 is not id=key", good},
		{"empty id", "=" + good, "entry 1: the key id", good},
		{"bad id", "k 1=" + good, "entry 1: the key id", good},
		{"not base64", "k1=" + "!!notbase64!!" + good[:10], `entry 1 (key id "k1"): the key is not valid base64`, good[:10]},
		{"too short", "k1=" + good + ",k2=" + short, `entry 2 (key id "k2"): the key is 16 bytes once decoded, want 32`, short},
		{"too long", "k1=" + long, `entry 1 (key id "k1"): the key is 48 bytes once decoded, want 32`, long},
		{"duplicate", "k1=" + good + ",k1=" + good, `key id "k1" appears twice`, good},
		{"only commas", " , ,", "holds no key", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			kr, err := Parse(c.spec)
			if err == nil {
				t.Fatalf("Parse accepted it: %v", kr)
			}
			msg := err.Error()
			if !strings.Contains(msg, c.want) {
				t.Fatalf("error %q does not say %q", msg, c.want)
			}
			if !strings.Contains(msg, EnvKeys) || !strings.Contains(msg, "head -c 32 /dev/urandom | base64") {
				t.Fatalf("error %q does not name the variable and the fix", msg)
			}
			if c.secret != "" && strings.Contains(msg, c.secret) {
				t.Fatalf("error shows key material: %q", msg)
			}
		})
	}
	// Spaces around entries and a trailing comma are fine.
	if _, err := Parse(" k1 = " + good + " ,"); err != nil {
		t.Fatalf("spaces: %v", err)
	}
	// Unpadded base64 is accepted.
	if _, err := Parse("k1=" + strings.TrimRight(good, "=")); err != nil {
		t.Fatalf("unpadded: %v", err)
	}
}

// TestKeyringPrintsNoKeyMaterial formats a keyring every way a log line or
// an error could, and looks for the key, its bytes and its derived keys.
func TestKeyringPrintsNoKeyMaterial(t *testing.T) {
	raw := make([]byte, KeySize)
	rand.Read(raw)
	b64 := base64.StdEncoding.EncodeToString(raw)
	kr := mustParse(t, "k1="+b64)

	var logs bytes.Buffer
	slog.New(slog.NewTextHandler(&logs, nil)).Info("started", "keys", kr)
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("started", "keys", kr)
	out := fmt.Sprintf("%v %+v %#v %s", kr, kr, kr, kr) + logs.String()
	if !strings.Contains(out, "k1") {
		t.Fatalf("output does not name the key id: %s", out)
	}
	forms := []string{b64, strings.TrimRight(b64, "="), fmt.Sprintf("%x", raw), string(raw),
		fmt.Sprintf("%v", raw), fmt.Sprintf("%x", derive(raw, "mefor seal v1"))}
	for _, f := range forms {
		if strings.Contains(out, f) {
			t.Fatalf("key material in formatted keyring: %s", out)
		}
	}
}

func BenchmarkSeal(b *testing.B) {
	kr := mustParse(b, "k1="+newKeyB64(b))
	body := bytes.Repeat([]byte("PID|||123456||DOE^JANE\r"), 40) // ~1 KB
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		kr.Seal(colRaw, row1, body)
	}
}

func BenchmarkOpen(b *testing.B) {
	kr := mustParse(b, "k1="+newKeyB64(b))
	body := bytes.Repeat([]byte("PID|||123456||DOE^JANE\r"), 40)
	sealed := kr.Seal(colRaw, row1, body)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := kr.Open(colRaw, row1, sealed); err != nil {
			b.Fatal(err)
		}
	}
}

// sealV1 seals plain as the release before row binding did (envelope mfe1,
// column-bound only), for the upgrade tests.
func sealV1(kr *Keyring, col Column, plain []byte) []byte {
	k := kr.active
	out := append([]byte(binMagicV1), byte(len(k.id)))
	out = append(out, k.id...)
	header := len(out)
	nonce := make([]byte, nonceSize)
	rand.Read(nonce)
	out = append(out, nonce...)
	return k.aead(nonce[:12]).Seal(out, nonce[12:], plain, aad(out[:header], col, "", true))
}

// sealStringV1 is sealV1 for a text value.
func sealStringV1(kr *Keyring, col Column, s string) string {
	header := textPrefixV1 + kr.active.id + ":"
	buf := make([]byte, nonceSize)
	rand.Read(buf)
	buf = kr.active.aead(buf[:12]).Seal(buf, buf[12:nonceSize], []byte(s), aad([]byte(header), col, "", true))
	return header + base64.StdEncoding.EncodeToString(buf)
}

func TestValueOpensOnlyInItsRow(t *testing.T) {
	kr := mustParse(t, "k1="+newKeyB64(t))
	sealed := kr.Seal(colRaw, row1, []byte("MSH|PID|||DOE^JANE"))
	_, err := kr.Open(colRaw, row2, sealed)
	if !IsTampered(err) {
		t.Fatalf("bytea value of row 1 opened in row 2: %v; want a tampered value", err)
	}
	if got, err := kr.Open(colRaw, row1, sealed); err != nil || string(got) != "MSH|PID|||DOE^JANE" {
		t.Fatalf("Open in its own row = %q, %v", got, err)
	}
	s := kr.SealString(colError, row1, "attempt 1: DOE^JANE")
	if _, err := kr.OpenString(colError, row2, s); !IsTampered(err) {
		t.Fatalf("text value of row 1 opened in row 2: %v", err)
	}
	var mk *MissingKeyError
	if _, err := kr.Open(colRaw, row2, mustParse(t, "k9="+newKeyB64(t)).Seal(colRaw, row2, []byte("x"))); IsTampered(err) || !errors.As(err, &mk) {
		t.Fatalf("a missing key counts as tampered: %v", err)
	}
}

func TestLegacyEnvelopeOpensAndIsResealedRowBound(t *testing.T) {
	kr := mustParse(t, "k1="+newKeyB64(t))
	v1 := sealV1(kr, colRaw, []byte("MSH|legacy"))
	t1 := "attempt 2: " + sealStringV1(kr, colError, "legacy text")
	if got, err := kr.Open(colRaw, row1, v1); err != nil || string(got) != "MSH|legacy" {
		t.Fatalf("legacy value does not open: %q, %v", got, err)
	}
	if got, err := kr.OpenString(colError, row2, t1); err != nil || got != "attempt 2: legacy text" {
		t.Fatalf("legacy text does not open: %q, %v", got, err)
	}
	// Under the active key already, it is still resealed: into the row-bound form.
	out, changed, err := kr.Reseal(colRaw, row1, v1)
	if err != nil || !changed || !bytes.HasPrefix(out, BinaryHeader("k1")) {
		t.Fatalf("Reseal of a legacy value = %q, %v, %v; want an mfe2 value", out, changed, err)
	}
	if _, err := kr.Open(colRaw, row2, out); !IsTampered(err) {
		t.Fatalf("resealed value is not bound to its row: %v", err)
	}
	ts, changed, err := kr.ResealString(colError, row1, t1)
	if err != nil || !changed || !strings.HasPrefix(ts, "attempt 2: "+TextHeader("k1")) {
		t.Fatalf("ResealString of a legacy text = %q, %v, %v", ts, changed, err)
	}
	if again, changed, _ := kr.Reseal(colRaw, row1, out); changed || !bytes.Equal(again, out) {
		t.Fatal("a row-bound value under the active key was resealed again")
	}
}

func TestRefuseUnboundRefusesPlaintextAndLegacy(t *testing.T) {
	kr := mustParse(t, "k1="+newKeyB64(t))
	v1 := sealV1(kr, colRaw, []byte("MSH|legacy"))
	kr.RefuseUnbound(true)
	var ue *UnboundError
	if _, err := kr.Open(colRaw, row1, []byte("MSH|written by hand")); !errors.As(err, &ue) || ue.Legacy || !IsTampered(err) {
		t.Fatalf("plaintext read by a refusing keyring: %v", err)
	}
	if _, err := kr.Open(colRaw, row1, v1); !errors.As(err, &ue) || !ue.Legacy {
		t.Fatalf("legacy value read by a refusing keyring: %v", err)
	}
	if _, err := kr.OpenString(colError, row1, "clear"); !errors.As(err, &ue) {
		t.Fatalf("plaintext text read by a refusing keyring: %v", err)
	}
	if got, err := kr.Open(colRaw, row1, nil); err != nil || got != nil {
		t.Fatalf("NULL refused: %v", err)
	}
	if got, err := kr.Open(colRaw, row1, kr.Seal(colRaw, row1, []byte("MSH|ok"))); err != nil || string(got) != "MSH|ok" {
		t.Fatalf("row-bound value refused: %q, %v", got, err)
	}
	// Rotation still reads what it seals.
	if out, changed, err := kr.Reseal(colRaw, row1, []byte("MSH|clear")); err != nil || !changed || !bytes.HasPrefix(out, BinaryHeader("k1")) {
		t.Fatalf("Reseal of plaintext under a refusing keyring: %v", err)
	}
	if !kr.RefusesUnbound() {
		t.Fatal("RefusesUnbound = false")
	}
	kr.RefuseUnbound(false)
	if _, err := kr.Open(colRaw, row1, []byte("MSH|clear")); err != nil {
		t.Fatalf("plaintext refused after RefuseUnbound(false): %v", err)
	}
}
