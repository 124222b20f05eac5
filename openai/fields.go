package openai

import (
	"encoding/json"
	"slices"
	"strconv"
)

// A decodeFunc decodes raw, the value of one member of a JSON object, into
// *d. raw is never null: an explicit null is dropped as absent before any
// decoder runs. param is the member's path for errors, in OpenAI's syntax
// (messages[1].content).
type decodeFunc[T any] func(d *T, raw json.RawMessage, param string) *Error

// field is one known member of a JSON object.
type field[T any] struct {
	name     string
	required bool // absent → missing_required_parameter
	// decode is nil for a member the caller reads before the table runs,
	// because it selects the table (a message's role).
	decode decodeFunc[T]
}

func required[T any](name string, decode decodeFunc[T]) field[T] {
	return field[T]{name: name, required: true, decode: decode}
}

func optional[T any](name string, decode decodeFunc[T]) field[T] {
	return field[T]{name: name, decode: decode}
}

func known[T any](name string) field[T] { return field[T]{name: name} }

// fields describes one kind of JSON object. Its list is at once the
// allow-list of the object's keys and the decoders of their values, so
// the two cannot disagree. Fields are decoded in list order: the order
// decides which error is reported when several fields are wrong, and lets
// a decoder rely on the fields before it. Tables are built once, at
// package initialisation, and only read afterwards.
type fields[T any] struct {
	list   []field[T]
	index  map[string]struct{} // the names in list
	path   string              // where decode finds the object ("" is the top level)
	params []string            // list[i].name under path, built once so that decode does not allocate them
}

// newFields returns the table of an object found at path; decodeAt serves
// objects whose path varies, such as tools[3]. It panics if a name is
// listed twice, so such a table fails at package initialisation.
func newFields[T any](path string, list ...field[T]) *fields[T] {
	fs := &fields[T]{list: list, index: make(map[string]struct{}, len(list)), path: path}
	for _, f := range list {
		if _, dup := fs.index[f.name]; dup {
			panic("openai: field " + join(path, f.name) + " is listed twice")
		}
		fs.index[f.name] = struct{}{}
		fs.params = append(fs.params, join(path, f.name))
	}
	return fs
}

// names lists the fields in decoding order.
func (fs *fields[T]) names() []string {
	names := make([]string, len(fs.list))
	for i, f := range fs.list {
		names[i] = f.name
	}
	return names
}

// decode checks obj, found at the table's path, and decodes it into *d.
func (fs *fields[T]) decode(d *T, obj object) *Error { return fs.run(d, obj, fs.path, fs.params) }

// decodeAt is decode for an object found at path.
func (fs *fields[T]) decodeAt(d *T, obj object, path string) *Error { return fs.run(d, obj, path, nil) }

// run refuses the first unknown key, then decodes the fields in order.
// params holds the fields' paths when they are known in advance; otherwise
// a path is built only for a field that is present or missing.
func (fs *fields[T]) run(d *T, obj object, path string, params []string) *Error {
	if k, ok := fs.firstUnknown(obj); ok {
		return unknownField(join(path, k))
	}
	for i := range fs.list {
		f := &fs.list[i]
		raw, ok := obj.get(f.name)
		if ok && f.decode == nil || !ok && !f.required {
			continue
		}
		var param string
		if params != nil {
			param = params[i]
		} else {
			param = join(path, f.name)
		}
		if !ok {
			return missing(param)
		}
		if e := f.decode(d, raw, param); e != nil {
			return e
		}
	}
	return nil
}

// firstUnknown returns the alphabetically first key of obj that the table
// does not list, so the error is the same on every run.
func (fs *fields[T]) firstUnknown(obj object) (string, bool) {
	bad, found := "", false
	for i := range obj {
		k := obj[i].key
		if _, ok := fs.index[string(k)]; !ok && (!found || string(k) < bad) {
			bad, found = string(k), true
		}
	}
	return clip(bad), found
}

// firstUnknownOf is firstUnknown for an object whose few allowed keys
// depend on a value in it, such as a content part's type.
func firstUnknownOf(obj object, allowed ...string) (string, bool) {
	bad, found := "", false
	for i := range obj {
		k := obj[i].key
		if !slices.Contains(allowed, string(k)) && (!found || string(k) < bad) {
			bad, found = string(k), true
		}
	}
	return clip(bad), found
}

// join is the path of member name of the object at path.
func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// A parser turns a raw JSON value into a V, or a 400 naming param.
type parser[V any] func(raw []byte, param string) (V, *Error)

// set decodes a value with parse into the field of *d that at returns.
func set[T, V any](parse parser[V], at func(*T) *V) decodeFunc[T] {
	return func(d *T, raw json.RawMessage, param string) (e *Error) {
		*at(d), e = parse(raw, param)
		return e
	}
}

// setPtr is set for a field that stays nil when the member is absent.
func setPtr[T, V any](parse parser[V], at func(*T) **V) decodeFunc[T] {
	return func(d *T, raw json.RawMessage, param string) *Error {
		v, e := parse(raw, param)
		if e != nil {
			return e
		}
		*at(d) = &v
		return nil
	}
}

// eachElement decodes the array raw at param item by item, each with its
// path (param[i]), stopping at the first error.
func eachElement(raw json.RawMessage, param string, each func(it json.RawMessage, p string) *Error) *Error {
	items, e := asArray(raw, param)
	if e != nil {
		return e
	}
	for i, it := range items {
		if e := each(it, param+"["+strconv.Itoa(i)+"]"); e != nil {
			return e
		}
	}
	return nil
}

// eachString is eachElement for an array of strings.
func eachString(raw json.RawMessage, param string, each func(v, p string) *Error) *Error {
	return eachElement(raw, param, func(it json.RawMessage, p string) *Error {
		v, e := asString(it, p)
		if e != nil {
			return e
		}
		return each(v, p)
	})
}

// nested decodes raw, an object found at param, into *d with fs.
func nested[T any](d *T, raw json.RawMessage, param string, fs *fields[T]) *Error {
	obj, e := asObject(raw, param)
	if e != nil {
		return e
	}
	return fs.decode(d, obj)
}
