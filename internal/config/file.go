package config

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
)

// parseFile reads the TOML file: one flat table, one key per setting (a
// table-valued setting may be a [section]). It is read strictly: an unknown
// key is an error naming its line, with a hint when it is a near miss.
// Values are decoded as `any` and type-checked here: go-toml's own type
// errors name Go fields rather than the key the operator wrote.
func (l *Loader) parseFile(settings []Setting, path string, data []byte) ([]found, error) {
	var doc map[string]any
	if err := toml.Unmarshal(data, &doc); err != nil {
		var de *toml.DecodeError
		if errors.As(err, &de) {
			row, col := de.Position()
			return nil, fmt.Errorf("config file %s line %d column %d: %s", path, row, col, strings.TrimPrefix(de.Error(), "toml: "))
		}
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	byKey := make(map[string]Setting, len(settings))
	for _, s := range settings {
		byKey[s.Key] = s
	}
	lines, errs := l.scanKeys(settings, byKey, path, data)

	keys := make([]string, 0, len(doc))
	for k := range doc {
		if _, ok := byKey[k]; ok {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return lines[keys[i]] < lines[keys[j]] })
	out := make([]found, 0, len(keys))
	for _, k := range keys {
		s := byKey[k]
		where := fmt.Sprintf("%s line %d", path, lines[k])
		v, err := fromTOML(s.kind, doc[k])
		if err == nil && s.kind == kindTable {
			err = l.notSettings(byKey, k, v.table)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("config %s (%s): %w", k, where, err))
			continue
		}
		out = append(out, found{setting: s, val: v, where: where})
	}
	return out, errors.Join(errs...)
}

// scanKeys finds the first line of each top-level key, and reports keys
// (and sections) that are no setting. The document has already been
// decoded, so it parses.
func (l *Loader) scanKeys(settings []Setting, byKey map[string]Setting, path string, data []byte) (map[string]int, []error) {
	lines := map[string]int{}
	var errs []error
	var p unstable.Parser
	p.Reset(data)
	inTable := false
	for p.NextExpression() {
		e := p.Expression()
		var section bool
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable:
			inTable, section = true, true
		case unstable.KeyValue:
			if inTable {
				continue // belongs to the table; the table is checked as a whole
			}
		default:
			continue
		}
		var parts []string
		line := 0
		for it := e.Key(); it.Next(); {
			n := it.Node()
			if line == 0 {
				line = p.Shape(n.Raw).Start.Line
			}
			parts = append(parts, string(n.Data))
		}
		if _, known := byKey[parts[0]]; known {
			if _, seen := lines[parts[0]]; !seen {
				lines[parts[0]] = line
			}
			continue
		}
		key := strings.Join(parts, ".")
		msg := fmt.Sprintf("config file %s line %d: unknown key %q", path, line, key)
		if hint := suggest(settings, key); hint != "" {
			msg += fmt.Sprintf(" (did you mean %s?)", hint)
		} else if section {
			msg += " (the file has no sections: write every key at the top)"
		}
		errs = append(errs, errors.New(msg))
	}
	return lines, errs
}

// notSettings catches settings inside a table: in TOML every key after a
// [table] header belongs to that table, so settings written below it would
// otherwise silently become entries of the table.
func (l *Loader) notSettings(byKey map[string]Setting, table string, m map[string]any) error {
	names := make([]string, 0, len(m))
	for k := range m {
		if _, ok := byKey[k]; ok {
			names = append(names, k)
		}
	}
	if len(names) == 0 {
		return nil
	}
	sort.Strings(names)
	return fmt.Errorf("%s is a %s setting, not part of %s: move it above the [%s] header or write the table inline",
		strings.Join(names, ", "), l.Program, table, table)
}
