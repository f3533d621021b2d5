package main

import (
	"os"

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
