package crypt

import (
	"encoding/base64"
	"strings"
)

// blindPrefix starts a blind index value: "bi1:" id ":" base64url(HMAC).
const blindPrefix = "bi1:"

// blindSize is how much of the HMAC a blind index keeps: 128 bits make a
// chance collision between two patients' ids negligible.
const blindSize = 16

// BlindIndex is the keyed blind index of value under the active key, for
// purpose (say "patient"), so equal values index equally only within one
// purpose. With encryption off it is value itself, as stored before.
func (kr *Keyring) BlindIndex(purpose, value string) string {
	if kr == nil || value == "" {
		return value
	}
	return kr.active.blindIndex(purpose, value)
}

// BlindIndexes is value's blind index under every key of the ring, active
// first: what a search must look for while values indexed under an older
// key remain. With encryption off it is value alone.
func (kr *Keyring) BlindIndexes(purpose, value string) []string {
	if kr == nil || value == "" {
		return []string{value}
	}
	out := make([]string, 0, len(kr.ids))
	for _, id := range kr.ids {
		out = append(out, kr.byID[id].blindIndex(purpose, value))
	}
	return out
}

// BlindPrefix is how every blind index begins.
func BlindPrefix() string { return blindPrefix }

// BlindHeader is how a blind index made under key id begins.
func BlindHeader(id string) string { return blindPrefix + id + ":" }

// BlindKeyID is the key id a blind index was made under.
func BlindKeyID(index string) (id string, ok bool) {
	if !strings.HasPrefix(index, blindPrefix) {
		return "", false
	}
	id, _, ok = strings.Cut(index[len(blindPrefix):], ":")
	return id, ok
}

func (k *key) blindIndex(purpose, value string) string {
	var buf [32]byte
	sum := mac(&k.blind, buf[:0], []byte(purpose), []byte{0}, []byte(value))
	return blindPrefix + k.id + ":" + base64.RawURLEncoding.EncodeToString(sum[:blindSize])
}
