package hl7

import "testing"

func TestUnescapeValue(t *testing.T) {
	t.Parallel()
	d := DefaultDelimiters()
	tests := []struct{ in, want string }{
		{"plain", "plain"},
		{`a\F\b`, "a|b"},
		{`a\S\b\T\c\R\d\E\e`, `a^b&c~d\e`},
		{`\X0D0A\`, "\r\n"},
		{`\X41\\x42\`, `A\x42\`}, // lowercase x is not the hex escape
		{`\X414\`, `\X414\`},     // odd number of digits
		{`\XZZ\`, `\XZZ\`},       // not hex
		{`\X\`, `\X\`},
		{`\H\bold\N\`, `\H\bold\N\`}, // formatting is kept
		{`line\.br\next`, `line\.br\next`},
		{`\P\`, `\P\`}, // no truncation character declared
		{`trailing\`, `trailing\`},
		{`\F`, `\F`},
		{`\\`, `\\`},
		{`\E\F\`, `\F\`},
		{`\F\\S\`, "|^"},
	}
	for _, tt := range tests {
		if got := d.UnescapeValue(tt.in); got != tt.want {
			t.Errorf("UnescapeValue(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}

	d.Truncation = '#'
	if got := d.UnescapeValue(`a\P\b`); got != "a#b" {
		t.Errorf("with truncation: got %q", got)
	}
}

func TestEscapeValue(t *testing.T) {
	t.Parallel()
	d := DefaultDelimiters()
	tests := []struct{ in, want string }{
		{"plain", "plain"},
		{"", ""},
		{`a|b^c&d~e\f`, `a\F\b\S\c\T\d\R\e\E\f`},
		{"one\r\ntwo", `one\X0D\\X0A\two`},
		{"#", "#"},
		{`\H\`, `\E\H\E\`},
	}
	for _, tt := range tests {
		got := d.EscapeValue(tt.in)
		if got != tt.want {
			t.Errorf("EscapeValue(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if back := d.UnescapeValue(got); back != tt.in {
			t.Errorf("UnescapeValue(EscapeValue(%q)) = %q", tt.in, back)
		}
	}

	d.Truncation = '#'
	if got := d.EscapeValue("a#b"); got != `a\P\b` {
		t.Errorf("with truncation: got %q", got)
	}
	// A NUL byte must not be mistaken for an undeclared truncation char.
	if got := DefaultDelimiters().EscapeValue("a\x00b"); got != "a\x00b" {
		t.Errorf("NUL escaped: %q", got)
	}
}

func TestFlatten(t *testing.T) {
	t.Parallel()
	d := DefaultDelimiters()
	raw := `a&b^c~d\F\`
	tests := []struct {
		lvl  level
		want string
	}{
		{levelField, raw},
		{levelRepetition, `a&b^c\R\d\F\`},
		{levelComponent, `a&b\S\c\R\d\F\`},
		{levelSubcomponent, `a\T\b\S\c\R\d\F\`},
	}
	for _, tt := range tests {
		if got := d.flatten(raw, tt.lvl); got != tt.want {
			t.Errorf("flatten(%q, %d) = %q, want %q", raw, tt.lvl, got, tt.want)
		}
	}
}
