package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/testcontainers"
)

// writeEncConfig writes a one-channel config whose encryption: section
// names keysRef.
func writeEncConfig(t *testing.T, keysRef string) string {
	t.Helper()
	dir := t.TempDir()
	p := filepath.Join(dir, "mefor.yaml")
	if err := os.WriteFile(p, []byte(`channels:
  adt:
    inbound: {mllp: {listen: "127.0.0.1:2575"}}
    routes: [{destinations: [out]}]
destinations:
  out: {type: file, file: {directory: `+filepath.Join(dir, "out")+`}}
encryption:
  keys: "`+keysRef+`"
`), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// A config that names the keys through ${...} seals with them: a message
// enqueued with the config is stored sealed under the variable's key, and
// `messages show --body` given the same keys opens it.
func TestConfigNamesEncryptionKeys(t *testing.T) {
	db := testcontainers.NewDB(t)
	spec := newKeySpec(t, "cfg1")
	t.Setenv("MEFOR_KEYS", spec)
	cfg := writeEncConfig(t, "${MEFOR_KEYS}")
	msg := filepath.Join(t.TempDir(), "adt.hl7")
	if err := os.WriteFile(msg, phiMessage("ENC1", "MRN4711", "WALRUS^GARBAGE"), 0o600); err != nil {
		t.Fatal(err)
	}

	code, out, errs := cli(t, db.URL, "", "config", "check", cfg)
	if code != 0 || !strings.Contains(out, "encryption at rest: keys from ${MEFOR_KEYS}: keyring (active cfg1; keys cfg1)") {
		t.Fatalf("config check: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := cli(t, db.URL, "", "enqueue", "--channel", "adt", "--config", cfg, msg); code != 0 {
		t.Fatalf("enqueue: exit %d\n%s%s", code, out, errs)
	}
	var raw []byte
	if err := db.Pool.QueryRow(context.Background(), `SELECT raw FROM mefor_message`).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	if id, ok := crypt.Sealed(raw); !ok || id != "cfg1" || bytes.Contains(raw, []byte("WALRUS")) {
		t.Fatalf("stored raw body is not sealed under cfg1 (sealed %v, key %q)", ok, id)
	}
	if code, out, errs := cli(t, db.URL, spec, "messages", "show", "1", "--body"); code != 0 || !strings.Contains(out, "WALRUS^GARBAGE") {
		t.Fatalf("show --body with the config's keys: exit %d\n%s%s", code, out, errs)
	}

	// MEFOR_ENCRYPTION_KEYS holding other keys than the config's variable
	// would split the data between two keyrings: refused, naming both
	// variables and the key ids only.
	other := newKeySpec(t, "env1")
	code, out, errs = cli(t, db.URL, other, "enqueue", "--channel", "adt", "--config", cfg, msg)
	if code != 1 || !strings.Contains(errs, "encryption.keys reads ${MEFOR_KEYS}") || !strings.Contains(errs, "MEFOR_ENCRYPTION_KEYS holds other keys") {
		t.Fatalf("enqueue with two keyrings: exit %d\n%s%s", code, out, errs)
	}
	for _, s := range []string{spec, other} {
		if _, key, _ := strings.Cut(s, "="); strings.Contains(out+errs, key) {
			t.Fatalf("the refusal shows a key:\n%s%s", out, errs)
		}
	}
	// The same keys in both is fine.
	if code, out, errs := cli(t, db.URL, spec, "enqueue", "--channel", "adt", "--config", cfg, msg); code != 0 {
		t.Fatalf("enqueue with the same keys in both variables: exit %d\n%s%s", code, out, errs)
	}
}

// A bad key named by the config stops config check and run with an error
// naming the file, the field and the fix; the key's bytes appear nowhere.
func TestConfigEncryptionBadKeyNeverPrinted(t *testing.T) {
	key := "c2hvcnQta2V5LW9mLTE2Yg==" // base64 of 16 bytes: the wrong length
	t.Setenv("MEFOR_KEYS", "k1="+key)
	cfg := writeEncConfig(t, "${MEFOR_KEYS}")
	for _, args := range [][]string{{"config", "check", cfg}, {"run", "--config", cfg}, {"config", "check", "--json", cfg}} {
		var stdout, stderr bytes.Buffer
		code := runEnv(args, &stdout, &stderr, envWith(""))
		all := stdout.String() + stderr.String()
		if code != 1 {
			t.Errorf("mefor %v: exit %d, want 1\n%s", args, code, all)
		}
		wants := []string{cfg + ":8:", "encryption.keys", `MEFOR_KEYS: entry 1 (key id "k1")`, "want 32", "head -c 32 /dev/urandom | base64"}
		if args[2] == "--json" {
			wants = []string{`"Line": 8`, `"Field": "encryption.keys"`, `MEFOR_KEYS: entry 1 (key id \"k1\")`, "want 32", "head -c 32 /dev/urandom | base64"}
		}
		for _, want := range wants {
			if !strings.Contains(all, want) {
				t.Errorf("mefor %v does not say %q:\n%s", args, want, all)
			}
		}
		for _, leak := range []string{key, strings.TrimRight(key, "="), "short-key-of-16b"} {
			if strings.Contains(all, leak) {
				t.Errorf("mefor %v prints the key:\n%s", args, all)
			}
		}
	}

	// A key written in the file itself is refused without quoting it.
	literal := writeEncConfig(t, "k1="+key)
	var stdout, stderr bytes.Buffer
	if code := runEnv([]string{"config", "check", literal}, &stdout, &stderr, envWith("")); code != 1 ||
		!strings.Contains(stdout.String(), "must be a reference to the environment variable") ||
		strings.Contains(stdout.String()+stderr.String(), key) {
		t.Errorf("a key in the file: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
}
