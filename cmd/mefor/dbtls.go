package main

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mefor/mefor/internal/dbtls"
)

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
