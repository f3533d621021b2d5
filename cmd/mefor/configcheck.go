package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/mefor/mefor/internal/config"
)

type configCmd struct {
	Check configCheckCmd `cmd:"" help:"Validate a config file; exit 1 listing every problem with file, line, field and fix."`
}

type configCheckCmd struct {
	File string `arg:"" type:"existingfile" help:"Config file to check."`
	JSON bool   `name:"json" help:"Print the result as JSON."`
}

func (c *configCheckCmd) Help() string {
	return `Loads the file exactly as 'mefor run' would (including ${ENV} interpolation)
and reports every problem at once.

Examples:
  mefor config check examples/quickstart/mefor.yaml
  mefor config check /etc/mefor/mefor.yaml --json`
}

type configCheckResult struct {
	File         string         `json:"file"`
	OK           bool           `json:"ok"`
	Errors       []config.Error `json:"errors,omitempty"`
	Warnings     []config.Error `json:"warnings,omitempty"`
	Channels     int            `json:"channels"`
	Handlers     int            `json:"handlers"`
	Destinations int            `json:"destinations"`
	Hash         string         `json:"hash,omitempty"`
}

func (c *configCheckCmd) Run(_ context.Context, g *Globals) error {
	cfg, err := config.Load(c.File)
	res := configCheckResult{File: c.File, OK: err == nil}
	var errs config.Errors
	switch {
	case errors.As(err, &errs):
		res.Errors = errs
	case err != nil:
		return err // unreadable file: already names it
	default:
		res.Warnings = cfg.Warnings
		res.Channels, res.Handlers, res.Destinations = len(cfg.Channels), len(cfg.Handlers), len(cfg.Destinations)
		res.Hash = cfg.Hash()
	}

	if c.JSON {
		if err := writeJSON(g.stdout, res); err != nil {
			return err
		}
	} else {
		for _, e := range res.Errors {
			fmt.Fprintln(g.stdout, e.Error())
		}
		for _, w := range res.Warnings {
			fmt.Fprintln(g.stdout, "warning: "+w.Error())
		}
		if res.OK {
			fmt.Fprintf(g.stdout, "%s: ok (%d channels, %d handlers, %d destinations)\n",
				c.File, res.Channels, res.Handlers, res.Destinations)
		}
	}
	if !res.OK {
		return &exitError{code: 1, err: fmt.Errorf("%s: %d problems", c.File, len(res.Errors))}
	}
	return nil
}
