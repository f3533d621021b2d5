// Package crypt seals message content at rest: AES-256-GCM under a keyring
// read from MEFOR_ENCRYPTION_KEYS, each value carrying the id of the key it
// was sealed under, so keys can be rotated while old values still read.
//
// # Keys
//
// MEFOR_ENCRYPTION_KEYS holds comma-separated id=base64 pairs, each key 32
// random bytes; the first pair is the active key, used for every new value.
// The others only open values sealed under them, until `mefor keys rotate`
// has re-sealed those under the active key and the pair can be dropped.
// An id is 1 to 32 letters, digits, '-' or '_'. Errors about the variable
// name the entry and the key id, never the key.
//
// # Envelopes
//
// A sealed value is self-describing, so a column can hold values under
// several keys and legacy plaintext side by side:
//
//	bytea columns:  0x00 'm' 'f' 'e' '2' len(id) id nonce(24) ciphertext‖tag(16)
//	text columns:   "mfe2:" id ":" base64(nonce(24) ‖ ciphertext‖tag(16))
//
// Releases before row binding wrote version 1 ("\x00mfe1", "mfe1:"), the
// same layout bound to the column only; Open still opens them, until the
// keyring refuses unbound values (below), and Reseal turns them into
// version 2. A value without the prefix is legacy plaintext, written before
// encryption was turned on (or while it was off): Open returns it as it is,
// and `mefor keys rotate` seals it. HL7 v2 starts with "MSH" and text columns
// hold mefor's own strings, so plaintext is told apart by its first bytes;
// the one ambiguity is a legacy bytea value that begins with the five bytes
// 0x00 "mfe1" (a malformed message could), which reads as a sealed value
// that does not open: an error naming the column, never garbage. A text
// envelope may follow clear text that SQL put in front of a sealed value
// (the finalizer's "dead-lettered: " before a sealed error); it runs to
// the end of the value, and opening keeps the clear text.
//
// # Authenticated data
//
// The envelope header (prefix and key id), the column's name and the row's
// binding (a Row: for message content "message <id>", for transform state
// its key, for reference values their set and key; the owner of each table
// says which) are the GCM additional data: a value moved to another column
// or copied onto another row, or whose key id was edited, fails to open
// (an *OpenError) instead of decrypting into the wrong place, or the wrong
// patient's chart. A version 1 value's additional data is the header and
// the column only.
//
// # Refusing unbound values
//
// Plaintext and version 1 values can be written or copied by anyone who
// can write the table. Once `mefor keys rotate` has sealed every one of
// them, the store is marked sealed and nodes call RefuseUnbound: Open then
// refuses them with an *UnboundError. IsTampered tells both errors (never
// use the value) from a *MissingKeyError (add the key).
//
// # Nonces
//
// Each Seal draws 24 fresh bytes from crypto/rand. The first 12 derive a
// one-value AES-256 key from the keyring key (HMAC-SHA256 of a label and
// those bytes), the last 12 are that key's GCM nonce. A GCM key and nonce
// pair therefore repeats only if all 192 random bits repeat: after 2^64
// seals under one keyring key the chance of any repeat is below 2^-64, a
// bound no deployment reaches (a plain random 96-bit nonce would allow only
// 2^32 seals, about a hundred days for a busy site). A rotation makes a new
// key active, which has sealed nothing, so its count starts from zero; rotate
// for key hygiene and after a suspected compromise, not for nonce wear.
//
// # Blind indexes
//
// A value that must be searched for but not stored in clear (a patient id)
// is kept as a keyed blind index: an HMAC-SHA256 of it under a key derived
// from a keyring key, tagged with that key's id. A search computes the
// index under every key of the ring.
package crypt
