package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// clientTLS is the TLS side of mefor send: any of its flags makes the
// connection TLS, verified against --tls-ca (or the system roots).
type clientTLS struct {
	CA         string `name:"tls-ca" type:"existingfile" placeholder:"FILE" help:"Connect with TLS and verify the listener against the CAs in FILE (PEM); without it, but with another --tls-* flag, the system roots."`
	Cert       string `name:"tls-cert" type:"existingfile" placeholder:"FILE" help:"Client certificate (PEM) to present, for a listener that requires one (with --tls-key)."`
	Key        string `name:"tls-key" type:"existingfile" placeholder:"FILE" help:"Private key (PEM) of --tls-cert."`
	ServerName string `name:"tls-server-name" placeholder:"NAME" help:"Name the listener's certificate must carry (default: the host of --to)."`
}

// config returns the TLS configuration, or nil when no flag asks for TLS.
func (f *clientTLS) config() (*tls.Config, error) {
	if f.CA == "" && f.Cert == "" && f.Key == "" && f.ServerName == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.CA != "" {
		pool, err := certPool(f.CA, "--tls-ca")
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if f.Cert != "" || f.Key != "" {
		pair, err := keyPair(f.Cert, f.Key)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// serverTLS is the TLS side of mefor sink.
type serverTLS struct {
	Cert     string `name:"tls-cert" type:"existingfile" placeholder:"FILE" help:"Listen with TLS, presenting this certificate (PEM; with --tls-key)."`
	Key      string `name:"tls-key" type:"existingfile" placeholder:"FILE" help:"Private key (PEM) of --tls-cert."`
	ClientCA string `name:"tls-client-ca" aliases:"tls-ca" type:"existingfile" placeholder:"FILE" help:"Require a client certificate signed by a CA in FILE (PEM); senders without one are refused during the handshake. --tls-ca is accepted as a synonym."`
}

// config returns the TLS configuration, or nil for a plaintext sink.
func (f *serverTLS) config() (*tls.Config, error) {
	if f.Cert == "" && f.Key == "" && f.ClientCA == "" {
		return nil, nil
	}
	pair, err := keyPair(f.Cert, f.Key)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}}
	if f.ClientCA != "" {
		pool, err := certPool(f.ClientCA, "--tls-client-ca")
		if err != nil {
			return nil, err
		}
		cfg.ClientAuth, cfg.ClientCAs = tls.RequireAndVerifyClientCert, pool
	}
	return cfg, nil
}

func keyPair(certFile, keyFile string) (tls.Certificate, error) {
	switch {
	case certFile == "":
		return tls.Certificate{}, errors.New("--tls-cert is required with --tls-key (or --tls-client-ca): the certificate to present")
	case keyFile == "":
		return tls.Certificate{}, errors.New("--tls-key is required with --tls-cert: the certificate's private key")
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("--tls-cert %s / --tls-key %s: %w", certFile, keyFile, err)
	}
	return pair, nil
}

func certPool(file, flag string) (*x509.CertPool, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%s %s holds no PEM certificate", flag, file)
	}
	return pool, nil
}
