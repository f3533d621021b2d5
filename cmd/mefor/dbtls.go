package main

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/dbtls"
)

// checkPlaintextStorage refuses to run a node without encryption keys
// when its database is not on this machine (a Unix socket or a loopback
// address): every message would be stored in plaintext on another host.
// --allow-plaintext-storage (allow) lifts it.
func checkPlaintextStorage(rawURL string, keys, allow bool) error {
	if keys || allow || rawURL == "" {
		return nil
	}
	cfg, err := pgconn.ParseConfig(rawURL)
	if err != nil {
		return err
	}
	hosts := []string{cfg.Host}
	for _, fb := range cfg.Fallbacks {
		hosts = append(hosts, fb.Host)
	}
	for _, h := range hosts {
		if !dbtls.IsLocalHost(h) {
			return fmt.Errorf("the database is on another host (%s) and %s is not set, so message content would be stored there in plaintext: "+
				"set %s on every node (see 'mefor keys --help'), or pass --allow-plaintext-storage to run without encryption anyway",
				h, crypt.EnvKeys, crypt.EnvKeys)
		}
	}
	return nil
}

// checkDatabaseTLS applies the database TLS rule (package dbtls) to the
// main database URL; --allow-insecure-database lifts it.
func checkDatabaseTLS(cfg *pgconn.Config, rawURL string) error {
	err := dbtls.Check(cfg, rawURL)
	var ie *dbtls.InsecureError
	if errors.As(err, &ie) {
		return fmt.Errorf("the database URL %v; %s, "+
			"or pass --allow-insecure-database if the network to the database is trusted", ie, ie.Fix())
	}
	return err
}
