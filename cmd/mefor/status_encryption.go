package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/ops"
)

// printEncryption says whether the live nodes seal message content at
// rest, and under which key, and whether this command could open it.
//
// viaAPI: the status came through the API, whose node opens content with
// its own keys, so what this command holds is not said.
func printEncryption(w io.Writer, es *ops.EncryptionStatus, mine *crypt.Keyring, viaAPI bool) {
	fmt.Fprintln(w)
	switch es.State() {
	case "on":
		fmt.Fprintf(w, "encryption at rest: on, active key %s on every live node\n", es.Nodes[0].ActiveKey)
		if !es.SealedStore {
			fmt.Fprintln(w, "plaintext accepted until `mefor keys rotate` completes: it seals what was stored in plaintext or before row binding, then nodes refuse such values")
		}
	case "off":
		fmt.Fprintf(w, "encryption at rest: off: message content is stored in plaintext (set %s on every node; see 'mefor keys --help')\n",
			crypt.EnvKeys)
	case "mixed":
		var parts []string
		for _, n := range es.Nodes {
			k := n.ActiveKey
			if k == "" {
				k = "off (plaintext)"
			}
			parts = append(parts, n.Node+": "+k)
		}
		fmt.Fprintf(w, "warning: encryption at rest differs between nodes (%s): give every node the same %s\n",
			strings.Join(parts, ", "), crypt.EnvKeys)
	case "":
		if viaAPI {
			fmt.Fprintln(w, "encryption at rest: no live node has recorded it")
			break
		}
		state := "not set: content this command stores is kept in plaintext"
		if mine.Enabled() {
			state = "set, active key " + mine.ActiveID()
		}
		fmt.Fprintf(w, "encryption at rest: no live node has recorded it; this command's %s is %s\n", crypt.EnvKeys, state)
	}
	if es.State() != "off" && !mine.Enabled() && !viaAPI {
		fmt.Fprintf(w, "note: %s is not set for this command: it cannot show bodies or encrypted errors\n", crypt.EnvKeys)
	}
}
