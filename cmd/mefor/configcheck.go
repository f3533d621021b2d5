package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/tlsconf"
)

type configCmd struct {
	Check configCheckCmd `cmd:"" help:"Validate a config file; exit 1 listing every problem with file, line, field and fix."`
}

type configCheckCmd struct {
	File       string `arg:"" type:"existingfile" help:"Config file to check."`
	JSON       bool   `name:"json" help:"Print the result as JSON."`
	NoTLSFiles bool   `name:"no-tls-files" help:"Do not read the certificate, key and CA files the config names (on a machine that does not have them)."`
}

func (c *configCheckCmd) Help() string {
	return `Loads the file exactly as 'mefor run' would (including ${ENV} interpolation)
and reports every problem at once. It also reads the certificate, key and CA
files that TLS listeners and destinations name, as a node does when it starts:
a file that does not read, a key that is not its certificate's, or an
expired certificate is an error (the node would refuse to start), and a
certificate within tls_expiry_warning of its expiry is a warning. Run it as
the user mefor runs as, or pass --no-tls-files where the files are absent.

A plaintext listener on an address other machines can reach is an error
unless the listener says plaintext: true (a trusted network); a TLS
listener there that asks for no client certificate (no client_ca_file) is
a warning. Outbound connections in plaintext to another machine (an MLLP
destination without tls:, an http:// destination, reference source or
webhook) are warnings, each silenced by plaintext: true beside its address
or url.

With an egress: section, every destination, reference source, webhook and
proxy must be in egress.allow: each one outside it is an error naming where
it is written and what to add. The last line says where data may go.

Examples:
  mefor config check examples/quickstart/mefor.yaml
  mefor config check /etc/mefor/mefor.yaml --json
  mefor config check --no-tls-files mefor.yaml     # in CI, without the keys`
}

// checkedFile is what config check and reload say first about the file
// they loaded: whether it is valid, and its problems and warnings.
type checkedFile struct {
	File     string         `json:"file"`
	OK       bool           `json:"ok"`
	Errors   []config.Error `json:"errors,omitempty"`
	Warnings []config.Error `json:"warnings,omitempty"`
}

// printProblems prints the file's errors, then its warnings, one a line.
func (f *checkedFile) printProblems(w io.Writer) {
	for _, e := range f.Errors {
		fmt.Fprintln(w, e.Error())
	}
	for _, e := range f.Warnings {
		fmt.Fprintln(w, "warning: "+e.Error())
	}
}

type configCheckResult struct {
	checkedFile
	Channels     int    `json:"channels"`
	Handlers     int    `json:"handlers"`
	Destinations int    `json:"destinations"`
	AlertRules   int    `json:"alert_rules,omitempty"`
	Hash         string `json:"hash,omitempty"`
	// Encryption names the keys' variable and their ids, never a key.
	Encryption string `json:"encryption,omitempty"`
	// Egress says where data may go: unrestricted, or egress.allow.
	Egress string `json:"egress,omitempty"`
	// Certificates lists the certificates the TLS settings name, when
	// their files were read.
	Certificates []tlsconf.Certificate `json:"certificates,omitempty"`
}

func (c *configCheckCmd) Run(_ context.Context, g *Globals) error {
	cfg, err := config.Load(c.File)
	res := configCheckResult{checkedFile: checkedFile{File: c.File, OK: err == nil}}
	var errs config.Errors
	switch {
	case errors.As(err, &errs):
		res.Errors = errs
	case err != nil:
		return err // unreadable file: already names it
	default:
		res.Warnings = cfg.Warnings
		res.Channels, res.Handlers, res.Destinations = len(cfg.Channels), len(cfg.Handlers), len(cfg.Destinations)
		if cfg.Alerts != nil {
			res.AlertRules = len(cfg.Alerts.Rules)
		}
		res.Hash = cfg.Hash()
		var allow []string
		if cfg.Egress != nil {
			allow = cfg.Egress.Allow.Strings()
		}
		res.Egress = egressSummary(cfg.Egress != nil, allow)
		if cfg.Encryption != nil {
			res.Encryption = fmt.Sprintf("keys from ${%s}: %s", cfg.Encryption.KeysVar, cfg.Encryption.Keys)
			if _, err := g.configKeyring(cfg); err != nil {
				res.Errors, res.OK = append(res.Errors, config.Error{File: cfg.File, Message: err.Error()}), false
			}
		}
		if !c.NoTLSFiles {
			res.checkTLSFiles(cfg, time.Now())
		}
	}

	if c.JSON {
		if err := writeJSON(g.stdout, res); err != nil {
			return err
		}
	} else {
		res.printProblems(g.stdout)
		if res.OK {
			alerts := ""
			if res.AlertRules > 0 {
				alerts = fmt.Sprintf(", %d alert rules", res.AlertRules)
			}
			fmt.Fprintf(g.stdout, "%s: ok (%d channels, %d handlers, %d destinations%s)\n",
				c.File, res.Channels, res.Handlers, res.Destinations, alerts)
			if res.Encryption != "" {
				fmt.Fprintf(g.stdout, "encryption at rest: %s\n", res.Encryption)
			}
			fmt.Fprintf(g.stdout, "egress: %s\n", res.Egress)
		}
	}
	if !res.OK {
		noun := "problems"
		if len(res.Errors) == 1 {
			noun = "problem"
		}
		return &exitError{code: 1, err: fmt.Errorf("%s: %d %s", c.File, len(res.Errors), noun)}
	}
	return nil
}

// checkTLSFiles reads the TLS files as a starting node does, adding their
// problems as errors and the certificates close to expiry as warnings.
func (res *configCheckResult) checkTLSFiles(cfg *config.Config, now time.Time) {
	set, err := tlsconf.New(cfg, now)
	var errs config.Errors
	switch {
	case errors.As(err, &errs):
		res.Errors, res.OK = append(res.Errors, errs...), false
		return
	case err != nil:
		res.Errors, res.OK = append(res.Errors, config.Error{File: cfg.File, Message: err.Error()}), false
		return
	}
	res.Certificates = set.Certificates()
	for _, crt := range res.Certificates {
		if tlsconf.RenewSoon(crt.NotAfter, now, crt.WarnWindow(cfg.TLSExpiryWarning)) {
			left := crt.NotAfter.Sub(now)
			if crt.CRL {
				res.Warnings = append(res.Warnings, config.Error{File: cfg.File, Message: fmt.Sprintf(
					"%s in %s (%s) was due for its next update on %s: certificates revoked since are not refused; "+
						"install the CA's current CRL at the same path and run mefor reload",
					crt.Subject, crt.File, strings.Join(crt.Uses, "; "), crt.NotAfter.UTC().Format(time.RFC3339))})
				continue
			}
			res.Warnings = append(res.Warnings, config.Error{File: cfg.File, Message: fmt.Sprintf(
				"certificate %q in %s (%s) expires on %s, in %d days; install a renewed one at the same path and run mefor reload",
				crt.Subject, crt.File, strings.Join(crt.Uses, "; "), crt.NotAfter.UTC().Format(time.RFC3339), int(left.Hours()/24))})
		}
	}
}
