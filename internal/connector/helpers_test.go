package connector

import (
	"context"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/tlsconf"
)

// adtTo is a config whose channel adt routes to the destination dest;
// destinations is the rest of the file after "destinations:", dest's
// definition first. Its ${...} references are looked up with getenv.
func adtTo(t *testing.T, dest, destinations string, getenv func(string) (string, bool)) *config.Config {
	t.Helper()
	cfg, err := config.Parse("mefor.yaml", []byte(`
channels:
  adt:
    inbound: {mllp: {listen: 127.0.0.1:2575}}
    routes: [{destinations: [`+dest+`]}]
destinations:
`+destinations), getenv)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// sendOne sends one message to destination dest of cfg through a pool with
// cfg's TLS settings, as a drainer does; with, when not nil, sets the pool
// up further first.
func sendOne(t *testing.T, cfg *config.Config, dest string, with func(*Pool)) Result {
	t.Helper()
	set, err := tlsconf.New(cfg, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pool := NewPool()
	pool.UseTLS(set)
	if with != nil {
		with(pool)
	}
	defer pool.Close()
	s, err := pool.Get("outbound:"+dest, cfg.Destination(dest))
	if err != nil {
		t.Fatal(err)
	}
	return s.Send(context.Background(), Delivery{Payload: []byte(adt)})
}
