package testcontainers

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// SMTPImage is Debian's python3-aiosmtpd, built locally by
// peerimage/build.sh; peerimage/smtpd.py sets up STARTTLS and AUTH.
const SMTPImage = "mefor-aiosmtpd:1"

// SMTPPackages are the Debian packages of SMTPImage.
var SMTPPackages = []string{"python3-aiosmtpd"}

// SMTPOptions says how the server is set up.
type SMTPOptions struct {
	// CertPEM and KeyPEM, when set, make the server offer STARTTLS with
	// this certificate and require it before MAIL; otherwise it serves
	// plaintext only.
	CertPEM, KeyPEM []byte
	// User and Password, when set, make the server require AUTH as them.
	User, Password string
}

// SMTPServer is a running SMTP server.
type SMTPServer struct {
	*Peer
}

// Mail is one mail the server accepted.
type Mail struct {
	From string   `json:"from"`
	To   []string `json:"to"`
	// User is who authenticated, empty without AUTH.
	User string `json:"user"`
	// Data is the message as received: headers and body.
	Data string `json:"data"`
}

const smtpReceived = "/var/mail/received.jsonl"

// StartSMTP runs an SMTP server (aiosmtpd) with o's settings.
func StartSMTP(t testing.TB, o SMTPOptions) *SMTPServer {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile(filepath.Join(root, "testcontainers", "peerimage", "smtpd.py"))
	if err != nil {
		t.Fatal(err)
	}
	p := StartPeer(t, PeerOptions{
		Image: SMTPImage, Packages: SMTPPackages, Port: 2525, WaitFor: "smtpd ready",
		Setup: func(port int) ([]string, map[string][]byte) {
			files := map[string][]byte{"/opt/mefor/smtpd.py": script}
			cert, key := "", ""
			if len(o.CertPEM) > 0 {
				cert, key = "/opt/mefor/server.crt", "/opt/mefor/server.key"
				files[cert], files[key] = o.CertPEM, o.KeyPEM
			}
			return []string{"python3", "-u", "/opt/mefor/smtpd.py", itoa(port), cert, key, o.User, o.Password, smtpReceived}, files
		},
	})
	return &SMTPServer{Peer: p}
}

// Mails returns the mails the server accepted so far, in order.
func (s *SMTPServer) Mails(t testing.TB) []Mail {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	data, err := s.ReadFile(ctx, smtpReceived)
	if err != nil {
		t.Fatal(err)
	}
	var out []Mail
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line == "" {
			continue
		}
		var m Mail
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("the SMTP server's record %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}
