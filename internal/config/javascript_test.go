package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
)

// jsConfig is a config with one javascript handler whose javascript block
// is block, and script files written to dir.
func jsConfig(t *testing.T, dir, block string, files map[string]string) (string, []byte) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		_ = os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	y := `channels:
  adt:
    inbound: {mllp: {listen: "127.0.0.1:2575"}}
    routes:
      - {name: out, handler: visits, destinations: [lab]}
handlers:
  visits:
    type: javascript
    javascript: ` + block + `
destinations:
  lab: {type: mllp, mllp: {address: "127.0.0.1:2576"}}
`
	return filepath.Join(dir, "mefor.yaml"), []byte(y)
}

func TestJavaScriptHandlerLoads(t *testing.T) {
	dir := t.TempDir()
	main, lib := filepath.Join(dir, "visits.js"), filepath.Join(dir, "lib.js")
	name, y := jsConfig(t, dir, `{file: "`+main+`", libs: ["`+lib+`"]}`, map[string]string{
		"visits.js": "function transform(msg, ctx) { msg.set('ZVC-1', helper()); }",
		"lib.js":    "function helper() { return 1; }",
	})
	cfg, err := config.Parse(name, y, nil)
	if err != nil {
		t.Fatal(err)
	}
	js := cfg.Handler("visits").JavaScript
	if js.Timeout != time.Second || js.OnError != config.ScriptDeadLetter {
		t.Errorf("defaults: timeout %s, on_error %s; want 1s, dead-letter", js.Timeout, js.OnError)
	}
	if len(js.Scripts) != 2 || js.Scripts[0].Path != lib || js.Scripts[1].Path != main || js.Scripts[1].Program == nil {
		t.Errorf("scripts %+v, want the lib then the file, compiled", js.Scripts)
	}

	// The hash covers the scripts: same file, changed script, new hash.
	before := cfg.Hash()
	if err := os.WriteFile(main, []byte("function transform(msg) {}"), 0o644); err != nil {
		t.Fatal(err)
	}
	again, err := config.Parse(name, y, nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.Hash() == before {
		t.Error("a changed script leaves the config hash unchanged: a reload would not pick it up")
	}
}

func TestJavaScriptHandlerErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		name, block string
		files       map[string]string
		want        []string
	}{
		{"no file", `{timeout: 1s}`, nil,
			[]string{`mefor.yaml:9: handler "visits": javascript.file is required: the script defining function transform(msg, ctx)`}},
		{"missing file", `{file: ./nosuch.js}`, nil,
			[]string{`mefor.yaml:9: handler "visits": javascript.file ./nosuch.js cannot be read: no such file or directory (relative paths are resolved against mefor's working directory`}},
		{"syntax error", `{file: "` + filepath.Join(dir, "bad.js") + `"}`, map[string]string{"bad.js": "function transform(msg) {\n  msg.set('A-1', ;\n}"},
			[]string{`mefor.yaml:9: handler "visits": javascript.file ` + filepath.Join(dir, "bad.js") + `:2:18: SyntaxError: Unexpected token ;`}},
		{"syntax error in a lib", `{file: "` + filepath.Join(dir, "ok.js") + `", libs: ["` + filepath.Join(dir, "badlib.js") + `"]}`,
			map[string]string{"ok.js": "function transform() {}", "badlib.js": "var x = {;"},
			[]string{`javascript.libs[0] ` + filepath.Join(dir, "badlib.js") + `:1:11: SyntaxError`}},
		{"no transform", `{file: "` + filepath.Join(dir, "none.js") + `"}`, map[string]string{"none.js": "function transfrom(msg) {}"},
			[]string{"none.js does not define function transform(msg, ctx)"}},
		{"top level throws", `{file: "` + filepath.Join(dir, "throws.js") + `"}`, map[string]string{"throws.js": "undefinedThing();\nfunction transform() {}"},
			[]string{"throws.js: its top-level code fails: ReferenceError: undefinedThing is not defined"}},
		{"top level loops", `{file: "` + filepath.Join(dir, "loops.js") + `", timeout: 50ms}`, map[string]string{"loops.js": "while (true) {}\nfunction transform() {}"},
			[]string{"loops.js: its top-level code ran longer than the handler's timeout (50ms)"}},
		{"bad settings", `{file: "` + filepath.Join(dir, "ok.js") + `", timeout: 0s, on_error: retry}`, map[string]string{"ok.js": "function transform() {}"},
			[]string{"javascript.timeout must be > 0", `javascript.on_error "retry" is not an error policy (one of dead-letter, hold)`}},
		{"timeout too long", `{file: "` + filepath.Join(dir, "ok.js") + `", timeout: 5m}`, nil,
			[]string{"javascript.timeout 5m is too long: at most 30s"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			name, y := jsConfig(t, dir, tt.block, tt.files)
			_, err := config.Parse(name, y, nil)
			var errs config.Errors
			if !errors.As(err, &errs) {
				t.Fatalf("Parse = %v, want config errors", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("errors lack %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestKeepState(t *testing.T) {
	_, base := jsConfig(t, t.TempDir(), `{file: x.js}`, nil)
	base = []byte(strings.Replace(string(base), "handlers:\n  visits:\n    type: javascript\n    javascript: {file: x.js}\n", "", 1))
	base = []byte(strings.Replace(string(base), "handler: visits, ", "", 1))
	y := string(base) + "maintenance:\n  retention: {keep_bodies: 30d, keep_state: 400d}\n"
	cfg, err := config.Parse("m.yaml", []byte(y), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Maintenance.Retention.KeepState; got != 400*24*time.Hour {
		t.Errorf("keep_state %s", got)
	}
	_, err = config.Parse("m.yaml", []byte(strings.Replace(y, "keep_state: 400d", "keep_state: 0s", 1)), nil)
	if err == nil || !strings.Contains(err.Error(), "keep_state must be > 0") {
		t.Errorf("keep_state 0s: %v", err)
	}
}

// log_content is off unless set; set, it is a warning naming its line.
func TestJavaScriptLogContentIsFlagged(t *testing.T) {
	dir := t.TempDir()
	main := filepath.Join(dir, "visits.js")
	files := map[string]string{"visits.js": "function transform(msg, ctx) {}"}
	name, y := jsConfig(t, dir, `{file: "`+main+`"}`, files)
	cfg, err := config.Parse(name, y, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Handler("visits").JavaScript.LogContent || len(cfg.Warnings) != 0 {
		t.Fatalf("default: log_content %v, warnings %v", cfg.Handler("visits").JavaScript.LogContent, cfg.Warnings)
	}
	name, y = jsConfig(t, dir, `{file: "`+main+`", log_content: true}`, files)
	if cfg, err = config.Parse(name, y, nil); err != nil {
		t.Fatal(err)
	}
	if !cfg.Handler("visits").JavaScript.LogContent || len(cfg.Warnings) != 1 ||
		!strings.Contains(cfg.Warnings[0].Error(), `mefor.yaml:9: handler "visits": javascript.log_content is on: ctx.log writes`) {
		t.Fatalf("log_content: true: warnings %v", config.Errors(cfg.Warnings))
	}
}
