package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/nodeinfo"
)

func TestPrintTransport(t *testing.T) {
	now := time.Date(2030, 6, 1, 0, 0, 0, 0, time.UTC)
	cert := func(file string, left, window time.Duration) nodeinfo.CertificateInUse {
		return nodeinfo.CertificateInUse{
			NodeCertificate: nodeinfo.NodeCertificate{File: file, Subject: "CN=" + file, NotAfter: now.Add(left),
				WarnFrom: now.Add(left - window), Uses: []string{`channel "adt" server certificate`}},
			Nodes: []string{"a", "b"},
		}
	}
	ts := &nodeinfo.TransportStatus{
		Certificates: []nodeinfo.CertificateInUse{
			cert("gone.crt", -time.Hour, 30*24*time.Hour),
			cert("soon.crt", 10*24*time.Hour, 30*24*time.Hour),
			cert("fine.crt", 90*24*time.Hour, 30*24*time.Hour),
		},
		Listeners: []nodeinfo.ListenerInUse{
			{NodeListener: nodeinfo.NodeListener{Channel: "legacy", Listen: "0.0.0.0:2579", Exposed: true}, Flagged: true, Nodes: []string{"a"}},
			{NodeListener: nodeinfo.NodeListener{Channel: "trusted", Listen: "10.0.0.1:2580", Exposed: true, Acknowledged: true}, Nodes: []string{"a"}},
			{NodeListener: nodeinfo.NodeListener{Channel: "adt", Listen: "0.0.0.0:2575", TLS: true, ClientAuth: true, Exposed: true}, Nodes: []string{"a"}},
			{NodeListener: nodeinfo.NodeListener{Channel: "anyone", Listen: "0.0.0.0:2581", TLS: true, Exposed: true}, Flagged: true, Nodes: []string{"a"}},
		},
	}
	var b bytes.Buffer
	if err := printTransport(&b, ts, now); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	lineOf := func(file string) string {
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, file) {
				return strings.Join(strings.Fields(l), " ")
			}
		}
		return ""
	}
	for file, want := range map[string]string{
		"gone.crt": `gone.crt CN=gone.crt 2030-05-31 (EXPIRED) channel "adt" server certificate a, b`,
		"soon.crt": `soon.crt CN=soon.crt 2030-06-11 (in 10d, renew soon) channel "adt" server certificate a, b`,
		"fine.crt": `fine.crt CN=fine.crt 2030-08-30 (in 90d) channel "adt" server certificate a, b`,
	} {
		if got := lineOf(file); got != want {
			t.Errorf("row of %s:\n got %q\nwant %q", file, got, want)
		}
	}
	if !strings.Contains(out, `warning: channel "legacy" listens for plaintext MLLP on 0.0.0.0:2579`) {
		t.Errorf("no warning for the exposed plaintext listener:\n%s", out)
	}
	if !strings.Contains(out, `warning: channel "anyone" accepts TLS from any client, without a certificate, on 0.0.0.0:2581`) {
		t.Errorf("no warning for the exposed TLS listener without client certificates:\n%s", out)
	}
	if strings.Contains(out, `"trusted"`) || strings.Contains(out, `warning: channel "adt"`) {
		t.Errorf("flagged an acknowledged or mutual TLS listener:\n%s", out)
	}

	b.Reset()
	if err := printTransport(&b, &nodeinfo.TransportStatus{}, now); err != nil || b.Len() != 0 {
		t.Errorf("a cluster without TLS or exposed listeners printed %q", b.String())
	}
}
