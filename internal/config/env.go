package config

import (
	"fmt"
	"strings"
)

// unsetVarError is returned by expand for ${VAR} when VAR is not set and no
// default was given.
type unsetVarError struct {
	name string
}

func (e *unsetVarError) Error() string {
	return fmt.Sprintf("uses ${%s}, but %s is not set in the environment; set it or give a default, e.g. ${%s:-value}",
		e.name, e.name, e.name)
}

// expand replaces ${VAR} and ${VAR:-default} in s using getenv. The default
// applies when VAR is unset or empty, as in the shell. $${ is a literal ${.
func expand(s string, getenv func(string) (string, bool)) (string, error) {
	if !strings.Contains(s, "${") {
		return s, nil
	}
	var b strings.Builder
	for rest := s; rest != ""; {
		i := strings.Index(rest, "${")
		if i < 0 {
			b.WriteString(rest)
			break
		}
		if i > 0 && rest[i-1] == '$' {
			// "$${" is a literal "${": rest[:i] already ends in one "$".
			b.WriteString(rest[:i])
			b.WriteString("{")
			rest = rest[i+2:]
			continue
		}
		b.WriteString(rest[:i])
		end := strings.IndexByte(rest[i:], '}')
		if end < 0 {
			return "", fmt.Errorf("has an unterminated %q; close it with } (or write $${ for a literal ${)", rest[i:])
		}
		ref := rest[i+2 : i+end]
		name, def, hasDef := strings.Cut(ref, ":-")
		if !isVarName(name) {
			return "", fmt.Errorf("has ${%s}, which is not a variable reference; use ${NAME} or ${NAME:-default} with NAME made of letters, digits and _", ref)
		}
		v, ok := getenv(name)
		switch {
		case hasDef && v == "":
			v = def
		case !ok:
			return "", &unsetVarError{name: name}
		}
		b.WriteString(v)
		rest = rest[i+end+1:]
	}
	return b.String(), nil
}

func isVarName(s string) bool {
	if s == "" || ('0' <= s[0] && s[0] <= '9') {
		return false
	}
	for _, c := range []byte(s) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}
