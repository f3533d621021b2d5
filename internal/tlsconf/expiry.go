package tlsconf

import (
	"context"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"
)

// warnEvery is how often one certificate is warned about.
const warnEvery = 24 * time.Hour

// RenewSoon reports whether a certificate valid until notAfter is due for
// renewal as of now: it expires within window (the config's
// tls_expiry_warning), or has expired. It is the one rule behind a node's
// warnings (ExpiryWarner), 'mefor config check' and 'mefor status'.
func RenewSoon(notAfter, now time.Time, window time.Duration) bool {
	return notAfter.Sub(now) <= window
}

// WarnWindow is how long before c's NotAfter to warn about it, given the
// config's tls_expiry_warning: a certificate revocation list is warned
// about only once its next update has passed, since CAs publish a new
// one days before (a window of weeks would warn about every list all the
// time).
func (c Certificate) WarnWindow(window time.Duration) time.Duration {
	if c.CRL {
		return 0
	}
	return window
}

// ExpiryWarner logs, at most once a day per certificate, the certificates
// that expire within Window, and those that have expired (which a renewal
// followed by a reload cures; a restart would be refused). Each node warns
// about its own files: they are node-local, and each node may have renewed
// its copy or not.
type ExpiryWarner struct {
	Window time.Duration
	Logger *slog.Logger

	mu     sync.Mutex
	warned map[string]time.Time // by file and serial: when last warned
}

// Check warns about the certificates in certs that need it as of now. It
// returns how many it warned about.
func (w *ExpiryWarner) Check(ctx context.Context, certs []Certificate, now time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.warned == nil {
		w.warned = map[string]time.Time{}
	}
	n := 0
	for _, c := range certs {
		if !RenewSoon(c.NotAfter, now, c.WarnWindow(w.Window)) {
			continue
		}
		left := c.NotAfter.Sub(now)
		key := c.File + "\x00" + c.Serial
		if last, ok := w.warned[key]; ok && now.Sub(last) < warnEvery {
			continue
		}
		w.warned[key] = now
		n++
		attrs := []any{"file", c.File, "subject", c.Subject, "uses", strings.Join(c.Uses, "; "),
			"expires_at", c.NotAfter.UTC().Format(time.RFC3339)}
		if c.CRL {
			// A stale list still refuses what it lists; what it misses is
			// what the CA revoked since.
			w.Logger.WarnContext(ctx, "revocation list in use is due for its next update: certificates revoked since are not refused; "+
				"install the CA's current CRL at the same path and run mefor reload", attrs...)
			continue
		}
		if left <= 0 {
			w.Logger.ErrorContext(ctx, "certificate in use has expired: peers refuse it; install a renewed one at the same path and run mefor reload", attrs...)
			continue
		}
		w.Logger.WarnContext(ctx, "certificate expires soon: install a renewed one at the same path and run mefor reload",
			append(attrs, "days_left", int(math.Floor(left.Hours()/24)))...)
	}
	return n
}
