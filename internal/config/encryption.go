package config

import (
	"regexp"

	"go.yaml.in/yaml/v3"

	"github.com/mefor/mefor/internal/crypt"
)

// Encryption is the file's encryption: section. It names the environment
// variable holding the keyring content is sealed under at rest, in place of
// MEFOR_ENCRYPTION_KEYS; keys are never written in the file itself.
type Encryption struct {
	// KeysVar is the variable keys: names, as in keys: ${KEYS_VAR}.
	KeysVar string
	// Keys is the keyring read from it. Its String shows key ids only.
	Keys *crypt.Keyring
}

// varRef is a value that is one whole ${NAME} reference and nothing else.
var varRef = regexp.MustCompile(`^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$`)

const keysExample = `e.g. encryption: {keys: "${` + crypt.EnvKeys + `}"}`

// decodeEncryption reads encryption: keys. The raw value must be a single
// ${NAME}: a literal would put the keys in a file that is copied, diffed
// and hashed, and a ${NAME:-default} would hold a literal too. No error
// quotes the value: it may be key material.
func (l *loader) decodeEncryption(n *yaml.Node, p path) *Encryption {
	m := l.mapping(n, p, "keys")
	kp := p.key("keys")
	kn, ok := m["keys"]
	if !ok {
		if !l.failed(p) {
			l.errorf(kp, "is required: the environment variable holding the keys, %s", keysExample)
		}
		return nil
	}
	kn = resolve(kn)
	if kn.Kind != yaml.ScalarNode || isNull(kn) {
		l.errorAt(kn, kp, "must name the environment variable holding the keys, %s", keysExample)
		l.bad[kp] = true
		return nil
	}
	ref := varRef.FindStringSubmatch(kn.Value)
	if ref == nil {
		l.errorAt(kn, kp, "must be a reference to the environment variable holding the keys and nothing else, %s; "+
			"keys are never written in the file (a default after :- would be)", keysExample)
		l.bad[kp] = true
		return nil
	}
	name := ref[1]
	spec, _ := l.getenv(name)
	if spec == "" {
		l.errorAt(kn, kp, "uses ${%s}, but %s is not set in the environment (or is empty); set it to the keys "+
			"(id=base64 of 32 random bytes, comma-separated, the active key first), or remove encryption: to run without encryption at rest",
			name, name)
		l.bad[kp] = true
		return nil
	}
	kr, err := crypt.ParseFrom(name, spec)
	if err != nil {
		// crypt's errors name the entry and key id, never the key.
		l.errorAt(kn, kp, "%v", err)
		l.bad[kp] = true
		return nil
	}
	return &Encryption{KeysVar: name, Keys: kr}
}
