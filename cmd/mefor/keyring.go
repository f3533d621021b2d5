package main

import (
	"fmt"
	"os"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/crypt"
)

// keyring reads MEFOR_ENCRYPTION_KEYS, the keys every command that reads
// or writes content uses (nil: encryption off). A malformed variable is an
// error naming the entry and key id, never the key.
func (g *Globals) keyring() (*crypt.Keyring, error) {
	if g.lookupEnv == nil {
		g.lookupEnv = os.LookupEnv
	}
	return crypt.FromEnv(g.lookupEnv)
}

// configKeyring is the keyring of a command given cfg: the keys its
// encryption: section names (read when it was loaded), else
// MEFOR_ENCRYPTION_KEYS. When the section names another variable and
// MEFOR_ENCRYPTION_KEYS is set too, both must hold the same keys: the
// commands that take no config read MEFOR_ENCRYPTION_KEYS, and a node
// sealing under keys they lack would make its data unreadable to them.
func (g *Globals) configKeyring(cfg *config.Config) (*crypt.Keyring, error) {
	env, err := g.keyring()
	if cfg == nil || cfg.Encryption == nil {
		return env, err
	}
	enc := cfg.Encryption
	if enc.KeysVar == crypt.EnvKeys {
		return enc.Keys, nil
	}
	if err != nil {
		return nil, err
	}
	if env != nil && !env.SameKeys(enc.Keys) {
		return nil, fmt.Errorf("%s: encryption.keys reads ${%s} (%s), but %s holds other keys (%s); "+
			"give both variables the same keys, or unset %s (the commands that take no --config read it, so set it to the same keys for them)",
			cfg.File, enc.KeysVar, enc.Keys, crypt.EnvKeys, env, crypt.EnvKeys)
	}
	return enc.Keys, nil
}

// env is the environment lookup (os.LookupEnv unless a test sets one).
func (g *Globals) env() func(string) (string, bool) {
	if g.lookupEnv == nil {
		g.lookupEnv = os.LookupEnv
	}
	return g.lookupEnv
}
