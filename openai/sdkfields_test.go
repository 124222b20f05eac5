package openai

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/hearthd/hearth/internal/sealbox"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
)

// The request parameter types of the official Go SDK are the current
// OpenAI API, field by field. Each test below walks one route's type by
// reflection, every object it can send at any depth (each variant of a
// union), and sends the decoder a request with each field the SDK knows:
// none may be refused as an unknown parameter. A field is either honoured,
// accepted and ignored, or refused by its value with a reason, as the
// package comment's tables say; a new SDK version's new field fails here
// rather than as a customer's 400.
//
// An object is walked into only where the decoder checks its keys: the
// walk first sends it with a key no API has (zzz_probe), which must be
// refused naming it. An object taken whole — refused by its type or role,
// or free-form such as a JSON schema or metadata — is not walked into. A
// probe that cannot reach its object (a value the walk made up is refused
// on the way) fails the test, so that no part of the SDK is skipped
// silently: give the field a value in sdkSamples.

func TestSDKChatFieldsAreKnown(t *testing.T) {
	w := newSDKWalk(t, map[string]any{
		"model": testModel, "messages": []any{map[string]any{"role": "user", "content": "hi"}}, "stream": true,
	}, func(b []byte) *Error { _, e := DecodeChatRequest(b, testModel); return e })
	w.object(reflect.TypeFor[openai.ChatCompletionNewParams]())
	w.done(40)
}

func TestSDKResponsesFieldsAreKnown(t *testing.T) {
	w := newSDKWalk(t, map[string]any{"model": testModel, "input": "hi", "stream": true},
		func(b []byte) *Error { _, e := DecodeResponsesRequest(b, testModel, sealbox.Ephemeral()); return e })
	w.object(reflect.TypeFor[responses.ResponseNewParams]())
	w.done(60)
}

func TestSDKEmbeddingsFieldsAreKnown(t *testing.T) {
	w := newSDKWalk(t, map[string]any{"model": testModel, "input": "hi"},
		func(b []byte) *Error { _, e := DecodeEmbeddingsRequest(b, testModel); return e })
	w.object(reflect.TypeFor[openai.EmbeddingNewParams]())
	w.done(5)
}

func TestSDKCompletionsFieldsAreKnown(t *testing.T) {
	w := newSDKWalk(t, map[string]any{"model": testModel, "prompt": "hi", "stream": true},
		func(b []byte) *Error { _, e := DecodeCompletionRequest(b, testModel); return e })
	w.object(reflect.TypeFor[openai.CompletionNewParams]())
	w.done(15)
}

// sdkFill are members the decoder needs that the SDK does not require, by
// the object's discriminator or its SDK type's name.
var sdkFill = map[string]map[string]any{
	"function_call_output":                {"call_id": "c"},
	"ResponseInputItemItemReferenceParam": {"type": "item_reference"},
}

// sdkSamples are the values the walk gives a field it has to fill (a
// required one, on the way to another) where "x" would not do, by the
// field's JSON name after its SDK type's name, the object's discriminator
// (its type or role), or nothing.
var sdkSamples = map[string]any{
	"role":                               "user",
	"arguments":                          "{}",
	"mode":                               "auto",
	"ResponseComputerToolCallParam.type": "computer_call",
	"ToolChoiceTypesParam.type":          "file_search",
	"WebSearchToolParam.type":            "web_search",
	"WebSearchPreviewToolParam.type":     "web_search_preview",
}

// sdkWalk is one route's walk: the request it builds, and what it found.
type sdkWalk struct {
	t      *testing.T
	root   map[string]any
	decode func([]byte) *Error
	fields int             // SDK fields probed
	seen   map[string]bool // object paths walked, with their variant
	stack  []reflect.Type  // the types being walked, against cycles
}

func newSDKWalk(t *testing.T, root map[string]any, decode func([]byte) *Error) *sdkWalk {
	return &sdkWalk{t: t, root: root, decode: decode, seen: map[string]bool{}}
}

// done checks that the walk probed at least min fields, so that a walk
// broken by a change in the SDK's shape cannot pass by finding nothing.
func (w *sdkWalk) done(min int) {
	w.t.Helper()
	if w.fields < min {
		w.t.Errorf("probed %d SDK fields, want at least %d: the walk no longer finds them", w.fields, min)
	}
	w.t.Logf("probed %d SDK fields in %d objects", w.fields, len(w.seen))
}

// loc is where a value sits in the request being built: a member of an
// object, or the one element of an array.
type loc struct {
	obj   map[string]any
	key   string
	arr   []any
	path  string // OpenAI's syntax: tools[0].function.name
	label string // the path with each union's variant, for messages
}

func (l loc) set(v any) {
	if l.obj != nil {
		l.obj[l.key] = v
	} else {
		l.arr[0] = v
	}
}

func (w *sdkWalk) send() *Error {
	b, err := json.Marshal(w.root)
	if err != nil {
		w.t.Fatal(err)
	}
	return w.decode(b)
}

// object walks the top-level object.
func (w *sdkWalk) object(t reflect.Type) {
	w.walkObject(t, w.root, "", "")
}

// value walks the value of type t at l: each object it may be.
func (w *sdkWalk) value(t reflect.Type, l loc) {
	t = deref(t)
	switch {
	case isLeaf(t):
	case t.Kind() == reflect.Slice:
		el := deref(t.Elem())
		if isLeaf(el) {
			return
		}
		// An array whose elements the decoder does not look at (an
		// earlier output's annotations, sent back) is taken whole.
		arr := []any{true}
		l.set(arr)
		if w.send() == nil {
			return
		}
		w.value(el, loc{arr: arr, path: l.path + "[0]", label: l.label + "[0]"})
	case isUnion(t):
		for _, v := range unionVariants(t) {
			w.value(v, l)
		}
	case t.Kind() == reflect.Struct:
		if slices.Contains(w.stack, t) || len(w.stack) > 12 {
			return
		}
		obj := w.minimal(t).(map[string]any)
		l.set(obj)
		label := l.label + "<" + discriminator(obj) + ">"
		if w.seen[label+t.String()] {
			return
		}
		w.seen[label+t.String()] = true
		if w.reached(t, obj, loc{obj: l.obj, key: l.key, arr: l.arr, path: l.path, label: label}) {
			w.walkObject(t, obj, l.path, label)
		}
	}
}

// reached sends the object obj (of SDK type t) at path with an extra key
// no API knows, and tells whether the decoder checks its keys.
func (w *sdkWalk) reached(t reflect.Type, obj map[string]any, l loc) bool {
	w.t.Helper()
	path := l.path
	obj["zzz_probe"] = "x"
	e := w.send()
	delete(obj, "zzz_probe")
	switch {
	case e != nil && e.Code == "unknown_parameter" && e.Param == join(path, "zzz_probe"):
		return true // its keys are checked: walk them
	case e != nil && e.Code == "unknown_parameter":
		w.t.Errorf("%s: the SDK's %s is refused as unknown: %s", l.label, e.Param, e.Message)
		return false
	case e != nil && (e.Param == path || e.Param == strings.TrimSuffix(path, "[0]")):
		return false // refused whole (or its array), with a reason
	case e != nil && (e.Param == join(path, "type") && obj["type"] != "x" || e.Param == join(path, "role") && obj["role"] != "x"):
		return false // refused by its type or role (a real one, not one the walk made up), with a reason
	case e != nil && (strings.HasPrefix(e.Param, path+".") || strings.HasPrefix(e.Param, path+"[")):
		w.t.Errorf("%s (SDK %s): the probe does not reach its keys: %v; give sdkSamples a value for the field at fault", l.label, t, e)
		return false
	}
	// Taken whole (free-form, or accepted and ignored) if the decoder
	// looks at it at all: a value no object field takes is refused there.
	l.set(true)
	e = w.send()
	l.set(obj)
	if e != nil && (e.Param == path || strings.HasPrefix(e.Param, path+".") || strings.HasPrefix(e.Param, path+"[") ||
		e.Param == strings.TrimSuffix(path, "[0]")) {
		return false
	}
	w.t.Errorf("%s (SDK %s): the probe does not reach it: %v; give sdkSamples a value for the field at fault", l.label, t, e)
	return false
}

// walkObject probes each field of t in obj, the object at path, then
// walks each field's value.
func (w *sdkWalk) walkObject(t reflect.Type, obj map[string]any, path, label string) {
	w.stack = append(w.stack, t)
	defer func() { w.stack = w.stack[:len(w.stack)-1] }()
	for _, f := range jsonFields(t) {
		old, had := obj[f.name]
		if !had {
			obj[f.name] = w.sample(t, f, obj)
		}
		w.fields++
		if e := w.send(); e != nil && e.Code == "unknown_parameter" && e.Param == join(path, f.name) {
			w.t.Errorf("%s: the SDK's field %s is refused as unknown: %s", label, join(path, f.name), e.Message)
		} else {
			w.value(f.typ, loc{obj: obj, key: f.name, path: join(path, f.name), label: join(label, f.name)})
		}
		if had {
			obj[f.name] = old
		} else {
			delete(obj, f.name)
		}
	}
}

// sample is a value for field f of obj.
func (w *sdkWalk) sample(t reflect.Type, f jsonField, obj map[string]any) any {
	for _, k := range []string{t.Name() + "." + f.name, discriminator(obj) + "." + f.name, f.name} {
		if v, ok := sdkSamples[k]; ok {
			return v
		}
	}
	return w.minimal(f.typ)
}

// minimal is the smallest value of SDK type t: an object holds its
// constants (type, role) and its required fields.
func (w *sdkWalk) minimal(t reflect.Type) any {
	t = deref(t)
	if c, ok := constantValue(t); ok {
		return c
	}
	switch {
	case isOpt(t):
		return w.minimal(t.Field(0).Type)
	case isUnion(t):
		vs := unionVariants(t)
		for _, v := range vs { // a string where one will do
			if v.Kind() == reflect.String || isOpt(v) {
				return w.minimal(v)
			}
		}
		return w.minimal(vs[0])
	}
	switch t.Kind() {
	case reflect.String:
		return "x"
	case reflect.Bool:
		return true
	case reflect.Int, reflect.Int64, reflect.Int32, reflect.Float64, reflect.Float32:
		return 1
	case reflect.Slice:
		return []any{w.minimal(t.Elem())}
	case reflect.Map, reflect.Interface:
		return map[string]any{}
	case reflect.Struct:
		obj := map[string]any{}
		for _, f := range jsonFields(t) {
			if _, ok := constantValue(deref(f.typ)); ok {
				obj[f.name] = w.minimal(f.typ)
			}
		}
		for k, v := range sdkFill[discriminator(obj)] {
			obj[k] = v
		}
		for k, v := range sdkFill[t.Name()] {
			obj[k] = v
		}
		for _, f := range jsonFields(t) {
			if f.required {
				if _, ok := obj[f.name]; !ok {
					obj[f.name] = w.sample(t, f, obj)
				}
			}
		}
		return obj
	}
	panic(fmt.Sprintf("no minimal value for %s", t))
}

type jsonField struct {
	name     string
	typ      reflect.Type
	required bool
}

// jsonFields are the JSON members of SDK struct t.
func jsonFields(t reflect.Type) []jsonField {
	var out []jsonField
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "" || name == "-" {
			continue
		}
		out = append(out, jsonField{name: name, typ: f.Type, required: f.Tag.Get("api") == "required"})
	}
	return out
}

// discriminator is what tells obj's variant: its type or role.
func discriminator(obj map[string]any) string {
	for _, k := range []string{"type", "role"} {
		if s, ok := obj[k].(string); ok {
			return s
		}
	}
	return ""
}

func deref(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

const sdkModule = "github.com/openai/openai-go/v3"

// isOpt tells param.Opt[T], an optional scalar.
func isOpt(t reflect.Type) bool {
	return t.Kind() == reflect.Struct && t.PkgPath() == sdkModule+"/packages/param" && strings.HasPrefix(t.Name(), "Opt[")
}

// isUnion tells a union: a struct of inline variants (OfString, OfX, …).
func isUnion(t reflect.Type) bool {
	if t.Kind() != reflect.Struct || isOpt(t) {
		return false
	}
	n := 0
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		if !strings.Contains(f.Tag.Get("json"), "inline") {
			return false
		}
		n++
	}
	return n > 0
}

func unionVariants(t reflect.Type) []reflect.Type {
	var out []reflect.Type
	for i := range t.NumField() {
		if f := t.Field(i); f.IsExported() {
			out = append(out, deref(f.Type))
		}
	}
	return out
}

// isLeaf tells a type the walk does not go into: scalars, maps (metadata,
// JSON schemas) and anything.
func isLeaf(t reflect.Type) bool {
	if _, ok := constantValue(t); ok || isOpt(t) {
		return true
	}
	switch t.Kind() {
	case reflect.Map, reflect.Interface, reflect.String, reflect.Bool, reflect.Int, reflect.Int64, reflect.Int32,
		reflect.Float64, reflect.Float32:
		return true
	}
	return false
}

// constantValue is the value of an SDK constant type (constant.Function
// is always "function").
func constantValue(t reflect.Type) (any, bool) {
	if t.Kind() != reflect.String || t.PkgPath() != sdkModule+"/shared/constant" {
		return nil, false
	}
	m, ok := t.MethodByName("Default")
	if !ok {
		return nil, false
	}
	return m.Func.Call([]reflect.Value{reflect.New(t).Elem()})[0].String(), true
}
