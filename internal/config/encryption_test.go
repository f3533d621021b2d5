package config_test

import (
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
)

const encDoc = `
channels:
  adt:
    inbound: {mllp: {listen: "127.0.0.1:2575"}}
    routes: [{destinations: [out]}]
destinations:
  out: {type: file, file: {directory: ./out}}
`

// encryption: keys names the keyring's variable through ${...}; the keys
// are checked when the file loads, and no error shows them.
func TestEncryptionKeys(t *testing.T) {
	good := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))
	short := base64.StdEncoding.EncodeToString([]byte("SHORTKEYSHORTKEY"))
	cfg, err := parse(t, encDoc+"encryption:\n  keys: \"${MEFOR_KEYS}\"\n", map[string]string{"MEFOR_KEYS": "k2=" + good})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Encryption == nil || cfg.Encryption.KeysVar != "MEFOR_KEYS" || cfg.Encryption.Keys.ActiveID() != "k2" {
		t.Fatalf("encryption: %+v", cfg.Encryption)
	}
	if s := fmt.Sprintf("%v %+v %#v", cfg.Encryption, *cfg.Encryption, cfg.Encryption); strings.Contains(s, good) {
		t.Errorf("printing the config's encryption shows the key: %s", s)
	}
	if cfg, err := parse(t, encDoc, nil); err != nil || cfg.Encryption != nil {
		t.Fatalf("no encryption: section: %v, %+v", err, cfg)
	}

	for _, tt := range []struct {
		name, value string
		env         map[string]string
		want        wantErr
	}{
		{"wrong length", `"${MEFOR_KEYS}"`, map[string]string{"MEFOR_KEYS": "k1=" + short},
			wantErr{8, "encryption.keys", `MEFOR_KEYS: entry 1 (key id "k1"): the key is 16 bytes once decoded, want 32 (AES-256); each entry is id=base64 of 32 random bytes`}},
		{"not base64", `"${MEFOR_KEYS}"`, map[string]string{"MEFOR_KEYS": "k1=" + good[:20] + "!!"},
			wantErr{8, "encryption.keys", `MEFOR_KEYS: entry 1 (key id "k1"): the key is not valid base64`}},
		{"bare key", `"${MEFOR_KEYS}"`, map[string]string{"MEFOR_KEYS": good},
			wantErr{8, "encryption.keys", "MEFOR_KEYS: entry 1 is not id=key"}},
		{"unset", `"${MEFOR_KEYS}"`, nil,
			wantErr{8, "encryption.keys", "uses ${MEFOR_KEYS}, but MEFOR_KEYS is not set in the environment (or is empty)"}},
		{"literal key", `"k1=` + good + `"`, nil,
			wantErr{8, "encryption.keys", "must be a reference to the environment variable holding the keys and nothing else"}},
		{"default", `"${MEFOR_KEYS:-k1=` + good + `}"`, nil,
			wantErr{8, "encryption.keys", "must be a reference to the environment variable holding the keys and nothing else"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse(t, encDoc+"encryption:\n  keys: "+tt.value+"\n", tt.env)
			if err == nil {
				t.Fatal("parsed without error")
			}
			checkErrs(t, err, []wantErr{tt.want})
			for _, secret := range []string{good, short, good[:20]} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("the error shows the key: %v", err)
				}
			}
		})
	}
	if _, err := parse(t, encDoc+"encryption: {}\n", nil); err == nil || !strings.Contains(err.Error(), "encryption.keys is required") {
		t.Errorf("empty encryption: section: %v", err)
	}
}
