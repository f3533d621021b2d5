package main

import (
	"encoding/json"
	"io"
)

// writeJSON is what every read command prints under --json: indented, one
// document, so it pipes into jq.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
