package testcontainers

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// RsyslogImage is Debian's rsyslog with its GnuTLS network stream driver,
// built locally by peerimage/build.sh.
const RsyslogImage = "mefor-rsyslog:1"

// RsyslogPackages are the Debian packages of RsyslogImage.
var RsyslogPackages = []string{"rsyslog", "rsyslog-gnutls"}

// RsyslogOptions says how the receiver listens.
type RsyslogOptions struct {
	// CAPEM, CertPEM and KeyPEM, when set, make it listen with TLS (any
	// client, no client certificate asked); otherwise plaintext TCP.
	CAPEM, CertPEM, KeyPEM []byte
}

// Rsyslog is a running rsyslog receiver.
type Rsyslog struct {
	*Peer
}

const rsyslogReceived = "/var/log/mefor/received.log"

// StartRsyslog runs rsyslog with a TCP input (octet-counted framing
// accepted) that writes each message it reads, as received, one a line.
func StartRsyslog(t testing.TB, o RsyslogOptions) *Rsyslog {
	t.Helper()
	p := StartPeer(t, PeerOptions{
		Image: RsyslogImage, Packages: RsyslogPackages, Port: 6514, WaitFor: "rsyslogd",
		Setup: func(port int) ([]string, map[string][]byte) {
			files := map[string][]byte{}
			global, module := `global(workDirectory="/tmp" maxMessageSize="64k")`, `module(load="imtcp")`
			if len(o.CertPEM) > 0 {
				global = `global(
	DefaultNetstreamDriver="gtls"
	DefaultNetstreamDriverCAFile="/etc/mefor-tls/ca.crt"
	DefaultNetstreamDriverCertFile="/etc/mefor-tls/server.crt"
	DefaultNetstreamDriverKeyFile="/etc/mefor-tls/server.key"
	workDirectory="/tmp"
	maxMessageSize="64k"
)`
				module = `module(load="imtcp" StreamDriver.Name="gtls" StreamDriver.Mode="1" StreamDriver.AuthMode="anon")`
				files["/etc/mefor-tls/ca.crt"], files["/etc/mefor-tls/server.crt"], files["/etc/mefor-tls/server.key"] = o.CAPEM, o.CertPEM, o.KeyPEM
			}
			files["/etc/mefor-rsyslog.conf"] = []byte(fmt.Sprintf(`%s
%s
input(type="imtcp" port="%d" address="127.0.0.1")
template(name="raw" type="string" string="%%rawmsg%%\n")
action(type="omfile" file="%s" template="raw" dirCreateMode="0755" flushOnTXEnd="on" asyncWriting="off")
`, global, module, port, rsyslogReceived))
			return []string{"rsyslogd", "-n", "-f", "/etc/mefor-rsyslog.conf", "-i", "/tmp/rsyslogd.pid"}, files
		},
	})
	// rsyslogd logs its start before its input listens.
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", p.Addr, time.Second)
		if err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rsyslog does not listen on %s: %v", p.Addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return &Rsyslog{Peer: p}
}

// WaitLines waits up to 20s for the receiver to have written n messages
// (it writes them a moment after reading them), and returns what it has.
func (r *Rsyslog) WaitLines(t testing.TB, n int) []string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		lines := r.Lines(t)
		if len(lines) >= n || time.Now().After(deadline) {
			return lines
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Lines returns the messages the receiver wrote so far, one a line; none
// before the first.
func (r *Rsyslog) Lines(t testing.TB) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	data, err := r.ReadFile(ctx, rsyslogReceived)
	if err != nil {
		msg := strings.ToLower(err.Error())
		if strings.Contains(msg, "no such file") || strings.Contains(msg, "not find") || strings.Contains(msg, "not found") {
			return nil
		}
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

func itoa(n int) string { return strconv.Itoa(n) }
