// Package config loads and validates mefor's channel configuration: one YAML
// file describing the cluster timings, the inbound channels, the handlers that
// rewrite messages and the destinations messages are delivered to.
//
// Loading is strict on purpose. An integration engine that guesses what a
// misspelled key meant routes patient data to the wrong place, so unknown keys,
// duplicate keys, dangling references and out-of-range values are all errors.
// Every problem found is reported at once, each with the file, line, field and
// a suggested fix, so a broken file can be repaired in one pass instead of one
// restart per typo.
//
// # Environment variables
//
// Scalar values may reference the environment as ${VAR} or ${VAR:-default};
// the default is used when VAR is unset or empty. A reference to an unset
// variable without a default is an error naming the variable. $${ produces a
// literal ${. Interpolation happens after YAML parsing, on values only: a
// variable can't inject YAML structure, comments are left alone, and line
// numbers in errors always match the file. Keys (including channel, handler
// and destination names) are never interpolated.
//
// # Paths
//
// Relative paths, such as a file destination's directory, are resolved
// against the working directory of the mefor process, not against the
// directory holding the configuration file. Run mefor from a fixed directory
// (systemd WorkingDirectory=, a container WORKDIR) or use absolute paths.
//
// # YAML features
//
// Anchors, aliases and merge keys (<<: *anchor) work as usual, which lets
// several destinations share one retry block. A file holds exactly one YAML
// document.
package config
