package client

import (
	"context"
	"encoding/json"
	"iter"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// The client's types and methods are checked against control/openapi.json
// here, so that neither can change without the other: every schema of the
// document has its Go type (or is the node protocol's), every property its
// field with the right JSON name, Go type, optionality and nullability,
// every enum its constants, and every customer operation its method with
// the right parameters and results.

// schemaTypes maps every customer-facing schema to its Go type.
var schemaTypes = map[string]reflect.Type{
	"Error":                     reflect.TypeFor[errorBody](),
	"ServerStatus":              reflect.TypeFor[ServerStatus](),
	"Stack":                     reflect.TypeFor[Stack](),
	"ServerName":                reflect.TypeFor[string](),
	"Chip":                      reflect.TypeFor[string](),
	"CreateServerRequest":       reflect.TypeFor[CreateServerRequest](),
	"Server":                    reflect.TypeFor[Server](),
	"UpdateServerRequest":       reflect.TypeFor[UpdateServerRequest](),
	"CreateSSHKeyRequest":       reflect.TypeFor[CreateSSHKeyRequest](),
	"SSHKey":                    reflect.TypeFor[SSHKey](),
	"Direction":                 reflect.TypeFor[Direction](),
	"Protocol":                  reflect.TypeFor[Protocol](),
	"Action":                    reflect.TypeFor[Action](),
	"CreateFirewallRuleRequest": reflect.TypeFor[CreateFirewallRuleRequest](),
	"FirewallRule":              reflect.TypeFor[FirewallRule](),
	"CreateAPIKeyRequest":       reflect.TypeFor[CreateAPIKeyRequest](),
	"APIKey":                    reflect.TypeFor[APIKey](),
	"CreatedAPIKey":             reflect.TypeFor[CreatedAPIKey](),
	"EnforcementConcern":        reflect.TypeFor[EnforcementConcern](),
	"Enforcement":               reflect.TypeFor[Enforcement](),
	"ActionCommand":             reflect.TypeFor[ActionCommand](),
	"ActionStatus":              reflect.TypeFor[ActionStatus](),
	"ActionResource":            reflect.TypeFor[ActionResource](),
	"ActionError":               reflect.TypeFor[ActionError](),
	"ServerAction":              reflect.TypeFor[ServerAction](),
	"UsageGranularity":          reflect.TypeFor[UsageGranularity](),
	"UsageGroupBy":              reflect.TypeFor[UsageGroupBy](),
	"UsageResult":               reflect.TypeFor[UsageResult](),
	"UsageBucket":               reflect.TypeFor[UsageBucket](),
	"Usage":                     reflect.TypeFor[Usage](),
	"AuditLogEntry":             reflect.TypeFor[AuditLogEntry](),
}

// nodeSchemas are the node protocol's (nodeapi), not the customer's.
var nodeSchemas = []string{"Hardware", "EnrollRequest", "EnrollResponse", "DesiredState", "ObservedState"}

// namedEnums are the values the package declares for each enum type.
var namedEnums = map[reflect.Type][]string{
	reflect.TypeFor[ServerStatus]():     strs(ServerStatuses()),
	reflect.TypeFor[Stack]():            strs(Stacks()),
	reflect.TypeFor[Direction]():        strs(Directions()),
	reflect.TypeFor[Protocol]():         strs(Protocols()),
	reflect.TypeFor[Action]():           strs(Actions()),
	reflect.TypeFor[ActionCommand]():    strs(ActionCommands()),
	reflect.TypeFor[ActionStatus]():     strs(ActionStatuses()),
	reflect.TypeFor[UsageGranularity](): strs(UsageGranularities()),
	reflect.TypeFor[UsageGroupBy]():     strs(UsageGroupings()),
}

// inlineEnums are the constants the package declares for enums of plain
// string fields, keyed by the Go type and JSON name of the field. Each
// value of the document must have one; error codes may be ahead of the
// document (forbidden).
var inlineEnums = map[string][]string{
	"Error.error.code": {CodeInvalidRequest, CodeUnauthorized, CodeForbidden, CodeNotFound, CodeConflict,
		CodeCapacityUnavailable, CodeIdempotencyConflict, CodeRateLimited, CodeMethodNotAllowed, CodePayloadTooLarge, CodeInternal, CodeUnavailable},
	"CreateServerRequest.billing": {BillingMonthly},
	"Server.billing":              {BillingMonthly},
	"EnforcementConcern.status":   {EnforcementPending, EnforcementApplied, EnforcementFailed},
	"ActionResource.type":         {"server", "api_key", "firewall_rule", "ssh_key"},
	"ActionError.code":            {"timeout", "apply_failed", "server_deleted", "superseded"},
	"AuditLogEntry.method":        {"POST", "PATCH", "DELETE", "PUT"},
	"RuntimeEnforcement.status":   {EnforcementPending, EnforcementApplied, EnforcementFailed},
	"RuntimeEnforcement.health":   {RuntimeHealthy, RuntimeDegraded, RuntimeRestarting},
}

func strs[T ~string](vs []T) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = string(v)
	}
	return out
}

type openAPIDoc struct {
	t       *testing.T
	doc     map[string]any
	schemas map[string]any
}

func loadDoc(t *testing.T) *openAPIDoc {
	t.Helper()
	raw, err := os.ReadFile("../control/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	return &openAPIDoc{t: t, doc: doc, schemas: doc["components"].(map[string]any)["schemas"].(map[string]any)}
}

// TestTypesFollowOpenAPI checks every schema of the document against its
// Go type.
func TestTypesFollowOpenAPI(t *testing.T) {
	d := loadDoc(t)
	for name := range schemaTypes {
		if _, ok := d.schemas[name]; !ok {
			t.Errorf("schema %s has a Go type but is not in openapi.json", name)
		}
	}
	for name, s := range d.schemas {
		if slices.Contains(nodeSchemas, name) {
			continue
		}
		typ, ok := schemaTypes[name]
		if !ok {
			t.Errorf("schema %s of openapi.json has no Go type in package client", name)
			continue
		}
		d.check(name, s.(map[string]any), typ)
	}
}

// TestMethodsFollowOpenAPI checks that every customer operation has its
// method, taking the path parameters, request body and query parameters
// the document names and returning its answer's type.
func TestMethodsFollowOpenAPI(t *testing.T) {
	d := loadDoc(t)
	client := reflect.TypeFor[*Client]()
	ops := 0
	for p, item := range d.doc["paths"].(map[string]any) {
		for method, o := range item.(map[string]any) {
			op, ok := o.(map[string]any)
			if !ok || method == "parameters" {
				continue
			}
			if tags, _ := op["tags"].([]any); slices.Contains(tags, any("nodes")) {
				continue
			}
			ops++
			id := op["operationId"].(string)
			name := strings.ToUpper(id[:1]) + id[1:]
			m, ok := client.MethodByName(name)
			if !ok {
				t.Errorf("%s %s (%s) has no method %s", strings.ToUpper(method), p, id, name)
				continue
			}
			d.checkMethod(id, p, op, m.Type)
		}
	}
	if ops < 18 {
		t.Fatalf("only %d customer operations found in openapi.json", ops)
	}
}

func (d *openAPIDoc) checkMethod(id, path string, op map[string]any, m reflect.Type) {
	t := d.t
	in := make([]reflect.Type, 0, m.NumIn())
	for i := 1; i < m.NumIn(); i++ { // 0 is the receiver
		in = append(in, m.In(i))
	}
	if len(in) == 0 || in[0] != reflect.TypeFor[context.Context]() {
		t.Errorf("%s: first parameter must be a context.Context", id)
		return
	}
	in = in[1:]
	strParams := 0
	for _, p := range in {
		if p.Kind() == reflect.String {
			strParams++
		}
	}
	if want := strings.Count(path, "{"); strParams != want {
		t.Errorf("%s: %d string (path) parameters, the path %s has %d", id, strParams, path, want)
	}
	if rb, ok := op["requestBody"].(map[string]any); ok {
		s := rb["content"].(map[string]any)["application/json"].(map[string]any)["schema"].(map[string]any)
		want := schemaTypes[refName(s)]
		if !slices.Contains(in, want) {
			t.Errorf("%s: takes no %v (the request body %s)", id, want, refName(s))
		}
	}
	if q := d.queryParams(op); len(q) > 0 {
		found := false
		for _, p := range in {
			if p.Kind() == reflect.Struct {
				found = true
				if got := queryTags(p); !slices.Equal(got, q) {
					t.Errorf("%s: %v has query fields %v, the document %v", id, p, got, q)
				}
			}
		}
		if !found {
			t.Errorf("%s: no parameters struct for the query %v", id, q)
		}
	}
	d.checkResults(id, op, m)
}

func (d *openAPIDoc) checkResults(id string, op map[string]any, m reflect.Type) {
	t := d.t
	last := m.Out(m.NumOut() - 1)
	if last != reflect.TypeFor[error]() {
		t.Errorf("%s: last result %v, want error", id, last)
	}
	for code, r := range op["responses"].(map[string]any) {
		if !strings.HasPrefix(code, "2") {
			continue
		}
		content, ok := r.(map[string]any)["content"].(map[string]any)
		if !ok { // 204
			if m.NumOut() != 1 {
				t.Errorf("%s answers %s with no body but returns %d values", id, code, m.NumOut())
			}
			continue
		}
		s := content["application/json"].(map[string]any)["schema"].(map[string]any)
		if m.NumOut() != 2 {
			t.Errorf("%s: returns %d values, want the answer and an error", id, m.NumOut())
			continue
		}
		got := m.Out(0)
		switch {
		case refName(s) != "":
			if want := schemaTypes[refName(s)]; got != want {
				t.Errorf("%s: returns %v, the document's answer is %s (%v)", id, got, refName(s), want)
			}
		case s["properties"] != nil: // a list envelope
			items := s["properties"].(map[string]any)["data"].(map[string]any)["items"].(map[string]any)
			item := schemaTypes[refName(items)]
			if got.Kind() != reflect.Struct || !strings.HasPrefix(got.Name(), "List[") ||
				got.Field(0).Type.Elem() != item {
				t.Errorf("%s: returns %v, want List[%v]", id, got, item)
				continue
			}
			d.check(id, s, got)
			d.checkAll(id, m, item)
		default: // the OpenAPI document itself: any object
			if got != reflect.TypeFor[[]byte]() {
				t.Errorf("%s: returns %v, want []byte", id, got)
			}
		}
	}
}

// checkAll checks that the list operation has its iterator: ListX → AllX,
// with the same parameters, yielding the items.
func (d *openAPIDoc) checkAll(id string, list reflect.Type, item reflect.Type) {
	name := "All" + strings.TrimPrefix(strings.ToUpper(id[:1])+id[1:], "List")
	m, ok := reflect.TypeFor[*Client]().MethodByName(name)
	if !ok {
		d.t.Errorf("%s: no iterator %s", id, name)
		return
	}
	if m.Type.NumIn() != list.NumIn() {
		d.t.Errorf("%s: %d parameters, List has %d", name, m.Type.NumIn(), list.NumIn())
	}
	for i := 1; i < min(m.Type.NumIn(), list.NumIn()); i++ {
		if m.Type.In(i) != list.In(i) {
			d.t.Errorf("%s: parameter %d is %v, List's is %v", name, i, m.Type.In(i), list.In(i))
		}
	}
	if want := reflect.TypeFor[iter.Seq2[struct{}, error]](); m.Type.NumOut() != 1 ||
		m.Type.Out(0).Kind() != want.Kind() || m.Type.Out(0).In(0).In(0) != item {
		d.t.Errorf("%s returns %v, want iter.Seq2[%v, error]", name, m.Type, item)
	}
}

func (d *openAPIDoc) queryParams(op map[string]any) []string {
	var out []string
	params, _ := op["parameters"].([]any)
	for _, p := range params {
		pm := p.(map[string]any)
		if ref := refName(pm); ref != "" {
			pm = d.doc["components"].(map[string]any)["parameters"].(map[string]any)[ref].(map[string]any)
		}
		if pm["in"] == "query" {
			out = append(out, pm["name"].(string))
		}
	}
	sort.Strings(out)
	return out
}

func queryTags(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			out = append(out, queryTags(f.Type)...)
		} else if q := f.Tag.Get("query"); q != "" {
			out = append(out, q)
		}
	}
	sort.Strings(out)
	return out
}

// refName is the schema a $ref names ("" if s is not a reference).
func refName(s map[string]any) string {
	ref, _ := s["$ref"].(string)
	return ref[strings.LastIndex(ref, "/")+1:]
}

func (d *openAPIDoc) resolve(s map[string]any) map[string]any {
	for refName(s) != "" {
		s = d.schemas[refName(s)].(map[string]any)
	}
	return s
}

// kind is what a schema allows: its one non-null type and whether null is
// allowed too.
func (d *openAPIDoc) kind(s map[string]any) (typ string, nullable bool, _ map[string]any) {
	s = d.resolve(s)
	if one, ok := s["oneOf"].([]any); ok {
		var rest map[string]any
		for _, alt := range one {
			a := d.resolve(alt.(map[string]any))
			if a["type"] == "null" {
				nullable = true
			} else {
				rest = a
			}
		}
		typ, _, rest = d.kind(rest)
		return typ, nullable, rest
	}
	switch v := s["type"].(type) {
	case string:
		return v, false, s
	case []any:
		for _, x := range v {
			if x == "null" {
				nullable = true
			} else {
				typ = x.(string)
			}
		}
		return typ, nullable, s
	}
	d.t.Fatalf("schema without a type: %v", s)
	return "", false, nil
}

// check compares one schema with a Go type, at path (for messages).
func (d *openAPIDoc) check(path string, schema map[string]any, typ reflect.Type) {
	d.checkKey(path, path, schema, typ)
}

// checkKey is check with the key of the field's enum constants
// (inlineEnums).
func (d *openAPIDoc) checkKey(path, key string, schema map[string]any, typ reflect.Type) {
	t := d.t
	kind, _, s := d.kind(schema)
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	switch kind {
	case "string":
		if s["format"] == "date-time" {
			if typ != reflect.TypeFor[time.Time]() {
				t.Errorf("%s: date-time as %v, want time.Time", path, typ)
			}
			return
		}
		if typ.Kind() != reflect.String {
			t.Errorf("%s: string as %v", path, typ)
			return
		}
		d.checkEnum(path, key, s, typ)
	case "integer":
		switch typ.Kind() {
		case reflect.Int, reflect.Int64, reflect.Int32, reflect.Uint64, reflect.Uint32, reflect.Uint:
		default:
			t.Errorf("%s: integer as %v", path, typ)
		}
	case "number":
		if typ.Kind() != reflect.Float64 && typ.Kind() != reflect.Float32 {
			t.Errorf("%s: number as %v", path, typ)
		}
	case "boolean":
		if typ.Kind() != reflect.Bool {
			t.Errorf("%s: boolean as %v", path, typ)
		}
	case "array":
		if typ.Kind() != reflect.Slice {
			t.Errorf("%s: array as %v", path, typ)
			return
		}
		d.check(path+"[]", s["items"].(map[string]any), typ.Elem())
	case "object":
		props, ok := s["properties"].(map[string]any)
		if !ok {
			return // any object
		}
		if typ.Kind() != reflect.Struct {
			t.Errorf("%s: object as %v", path, typ)
			return
		}
		d.checkObject(path, s, props, typ)
	default:
		t.Errorf("%s: type %q not handled by the test", path, kind)
	}
}

func (d *openAPIDoc) checkEnum(path, key string, s map[string]any, typ reflect.Type) {
	enum, ok := s["enum"].([]any)
	if !ok {
		return
	}
	var want []string
	for _, v := range enum {
		want = append(want, v.(string))
	}
	sort.Strings(want)
	if vals, ok := namedEnums[typ]; ok {
		got := slices.Sorted(slices.Values(vals))
		if !slices.Equal(got, want) {
			d.t.Errorf("%s: %v declares %v, the document %v", path, typ, got, want)
		}
		return
	}
	known := inlineEnums[key]
	if known == nil {
		d.t.Errorf("%s: enum %v has no constants listed for it (inlineEnums[%q])", path, want, key)
	}
	for _, v := range want {
		if !slices.Contains(known, v) {
			d.t.Errorf("%s: enum value %q has no constant", path, v)
		}
	}
}

type goField struct {
	typ       reflect.Type
	omitEmpty bool
}

// jsonFields are a struct's JSON properties, embedded structs flattened.
func jsonFields(typ reflect.Type) map[string]goField {
	out := map[string]goField{}
	for i := range typ.NumField() {
		f := typ.Field(i)
		tag, hasTag := f.Tag.Lookup("json")
		if f.Anonymous && !hasTag && f.Type.Kind() == reflect.Struct {
			for k, v := range jsonFields(f.Type) {
				out[k] = v
			}
			continue
		}
		if !f.IsExported() || tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" {
			name = f.Name
		}
		out[name] = goField{typ: f.Type, omitEmpty: strings.Contains(opts, "omitempty") || strings.Contains(opts, "omitzero")}
	}
	return out
}

func (d *openAPIDoc) checkObject(path string, s, props map[string]any, typ reflect.Type) {
	t := d.t
	fields := jsonFields(typ)
	required := map[string]bool{}
	reqd, _ := s["required"].([]any)
	for _, r := range reqd {
		required[r.(string)] = true
	}
	for name := range fields {
		if _, ok := props[name]; !ok {
			t.Errorf("%s: %v has field %q, the document does not", path, typ, name)
		}
	}
	for name, p := range props {
		at := path + "." + name
		f, ok := fields[name]
		if !ok {
			t.Errorf("%s: %v has no field for %q", at, typ, name)
			continue
		}
		_, nullable, _ := d.kind(p.(map[string]any))
		isPtr := f.typ.Kind() == reflect.Pointer
		switch {
		case required[name] && f.omitEmpty:
			t.Errorf("%s: required, but the field is omitempty", at)
		case !required[name] && !f.omitEmpty:
			t.Errorf("%s: optional, but the field is not omitempty (it would always be sent)", at)
		case nullable && !isPtr && f.typ.Kind() != reflect.Slice:
			t.Errorf("%s: nullable, but the field is a %v, not a pointer", at, f.typ)
		case !nullable && isPtr && required[name]:
			t.Errorf("%s: never null, but the field is a pointer", at)
		}
		key := typ.Name() + "." + name
		if typ.Name() == "" { // an anonymous struct: its place names it
			key = at
		}
		d.checkKey(at, key, p.(map[string]any), f.typ)
	}
}
