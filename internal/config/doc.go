package config

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// The settings table of a CONFIG.md stands between these lines.
const (
	DocBegin = "<!-- BEGIN settings: generated from the flags, do not edit -->"
	DocEnd   = "<!-- END settings -->"
)

// MarkdownTable renders the settings as a Markdown table: key, type,
// default, environment variable, flag and the flag's help text. In the help
// text the keys of other settings are set as code; only keys with an
// underscore, so that plain words such as "model" stay words.
func (l *Loader) MarkdownTable() string {
	settings := l.Settings()
	var keys []string
	for _, s := range settings {
		if strings.Contains(s.Key, "_") {
			keys = append(keys, regexp.QuoteMeta(s.Key))
		}
	}
	keyRe := regexp.MustCompile(`\b(` + strings.Join(keys, "|") + `)\b`)
	var b strings.Builder
	b.WriteString("| key | type | default | environment | flag | what it does |\n|---|---|---|---|---|---|\n")
	for _, s := range settings {
		usage := strings.ReplaceAll(s.Usage, "|", `\|`)
		if len(keys) > 0 {
			usage = codeOutside(usage, keyRe)
		}
		fmt.Fprintf(&b, "| `%s` | %s | `%s` | `%s` | `--%s` | %s |\n", s.Key, s.Type, s.Default, s.Env, s.Flag, usage)
	}
	return b.String()
}

// codeOutside sets re's matches as code, except inside existing code spans.
func codeOutside(s string, re *regexp.Regexp) string {
	parts := strings.Split(s, "`")
	for i := 0; i < len(parts); i += 2 { // even parts are outside backquotes
		parts[i] = re.ReplaceAllString(parts[i], "`$1`")
	}
	return strings.Join(parts, "`")
}

// UpdateDoc puts table between DocBegin and DocEnd in the Markdown file at
// path. It reports whether the file was out of date; only with write is it
// rewritten.
func UpdateDoc(path, table string, write bool) (stale bool, err error) {
	return UpdateSection(path, DocBegin, DocEnd, table, write)
}

// UpdateSection puts content between the lines begin and end of the file at
// path: the one way generated text (settings tables, the CLI reference)
// lives inside a hand-written document. It reports whether the file was out
// of date; only with write is it rewritten.
func UpdateSection(path, begin, end, content string, write bool) (stale bool, err error) {
	doc, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	b := bytes.Index(doc, []byte(begin+"\n"))
	e := bytes.Index(doc, []byte(end))
	if b < 0 || e < b {
		return false, fmt.Errorf("%s: no %q … %q section", path, begin, end)
	}
	start := b + len(begin) + 1
	if string(doc[start:e]) == content {
		return false, nil
	}
	if !write {
		return true, nil
	}
	out := append(append(append([]byte{}, doc[:start]...), content...), doc[e:]...)
	return true, os.WriteFile(path, out, 0o644)
}

var exampleLine = regexp.MustCompile(`(?m)^#([a-z][a-z0-9_]* = .*)$`)

// Commented returns the commented-out settings of an example file, such as
// a packaged configuration that shows every default: its lines
// "#key = value", uncommented, for a test to load.
func Commented(data []byte) string {
	var b strings.Builder
	for _, m := range exampleLine.FindAllSubmatch(data, -1) {
		b.Write(m[1])
		b.WriteByte('\n')
	}
	return b.String()
}
