package hl7

import "testing"

func BenchmarkParse(b *testing.B) {
	raw := []byte(adtA01)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(raw); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkGet(b *testing.B) {
	m := mustParse(b, adtA01)
	p := mustPath(b, "PID-3[2].1")
	b.ReportAllocs()
	for b.Loop() {
		_ = m.GetPath(p)
	}
}

func BenchmarkEncode(b *testing.B) {
	m := mustParse(b, adtA01)
	b.ReportAllocs()
	for b.Loop() {
		_ = m.Encode()
	}
}
