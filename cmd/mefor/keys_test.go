package main

import (
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// No help text, error or log line shows a key: --help with the variable
// set, a malformed variable, and a node's start-up log.
func TestKeysNeverPrinted(t *testing.T) {
	key := newKeySpec(t, "k1")
	material := strings.TrimPrefix(key, "k1=")
	raw, _ := base64.StdEncoding.DecodeString(material)
	t.Setenv("MEFOR_ENCRYPTION_KEYS", key)
	leaks := func(what, out string) {
		t.Helper()
		for _, form := range []string{material, strings.TrimRight(material, "="), string(raw)} {
			if strings.Contains(out, form) {
				t.Fatalf("%s shows the key:\n%s", what, out)
			}
		}
	}

	var cmds [][]string
	cmds = append(cmds, []string{"--help"})
	for _, c := range []string{"run", "migrate", "keys", "keys status", "keys rotate", "audit", "audit verify",
		"messages show", "enqueue", "status", "replay", "cancel", "stepdown", "reload"} {
		cmds = append(cmds, append(strings.Fields(c), "--help"))
	}
	for _, args := range cmds {
		var out, errb bytes.Buffer
		code := run(args, &out, &errb)
		if code != 0 {
			t.Fatalf("mefor %v: exit %d\n%s", args, code, errb.String())
		}
		leaks("mefor "+strings.Join(args, " "), out.String()+errb.String())
	}
	var out, errb bytes.Buffer
	run([]string{"keys", "--help"}, &out, &errb)
	if !strings.Contains(out.String(), "head -c 32 /dev/urandom | base64") || !strings.Contains(out.String(), "keys rotate") {
		t.Fatalf("keys --help does not say how to make and rotate keys:\n%s", out.String())
	}

	// A malformed variable: each command that reads it stops, naming the
	// entry, never the key.
	short := base64.StdEncoding.EncodeToString(raw[:16])
	file := filepath.Join(t.TempDir(), "mefor.yaml")
	if err := os.WriteFile(file, []byte(reloadConfigYAML(unusedAddr(t), unusedAddr(t))), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"k1=" + short, material, "k1=" + material + ",k1=" + material} {
		for _, args := range [][]string{{"run", "--config", file}, {"status"}, {"messages", "show", "1", "--body"}, {"keys", "status"}} {
			var out, errb bytes.Buffer
			code := runEnv(append(args, "--database-url", "postgres://u:p@127.0.0.1:1/x"), &out, &errb, envWith(bad))
			msg := out.String() + errb.String()
			if code == 0 || !strings.Contains(msg, "MEFOR_ENCRYPTION_KEYS") {
				t.Fatalf("mefor %v with a bad key: exit %d\n%s", args, code, msg)
			}
			leaks("mefor "+strings.Join(args, " ")+" with a bad key", msg)
			leaks("mefor "+strings.Join(args, " ")+" with a bad key", strings.ReplaceAll(msg, "\n", ""))
			for _, form := range []string{short, strings.TrimRight(short, "=")} {
				if strings.Contains(msg, form) {
					t.Fatalf("mefor %v shows the short key:\n%s", args, msg)
				}
			}
		}
	}
}
