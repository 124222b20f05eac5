package control_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/control"
)

// TestRevisionsAreEachServersOwn: what a customer sees of revisions, and
// what its node (which the customer can log into) is sent, count only that
// server's changes: another project's changes, however many, move neither,
// and the server's own move both by one.
func TestRevisionsAreEachServersOwn(t *testing.T) {
	e := newEnv(t, nil)
	nodes := []node{e.enroll(hwM4), e.enroll(hwM4)}
	p, err := control.CreateProject(e.st, "other", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	tok, err := control.CreateToken(e.st, control.TokenSpec{Project: p.ID, Name: "other"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	other := tok.Token

	var created enforcementView
	mine := e.req("POST", "/v1/servers", serverBody("mine")).must(t, 201)
	mine.decode(t, &created)
	id := idOf(t, mine)
	if created.Enforcement.DesiredRevision != 1 {
		t.Fatalf("a new server's revision is %d, want 1", created.Enforcement.DesiredRevision)
	}
	theirs := idOf(t, e.reqAs(other, "POST", "/v1/servers", serverBody("theirs")).must(t, 201))
	var n node
	var rev uint64
	for _, c := range nodes {
		if d := c.desired(t, 0); d.Server != nil && d.Server.ID == id {
			n, rev = c, d.Revision
		}
	}
	if n.client == nil {
		t.Fatal("no node was sent the server")
	}

	// The other project changes its server again and again.
	for i := range 20 {
		e.reqAs(other, "POST", "/v1/servers/"+theirs+"/firewall-rules", map[string]any{"direction": "inbound",
			"protocol": "tcp", "port_range": fmt.Sprint(1000 + i), "action": "allow"}).must(t, 201)
		e.reqAs(other, "POST", "/v1/servers/"+theirs+"/api-keys", map[string]any{"name": "k"}).must(t, 201)
	}
	if got := e.enforcementOf(t, id).Enforcement.DesiredRevision; got != 1 {
		t.Fatalf("after another project's changes the server shows revision %d, want 1", got)
	}
	if _, changed, err := n.client.Desired(context.Background(), rev, 50*time.Millisecond); err != nil || changed {
		t.Fatalf("another project's changes reached this server's node: changed %v, %v", changed, err)
	}

	// Its own change: one more, on both sides.
	e.req("POST", "/v1/servers/"+id+"/firewall-rules", map[string]any{"direction": "inbound", "protocol": "tcp",
		"port_range": "22", "action": "allow"}).must(t, 201)
	if got := e.enforcementOf(t, id).Enforcement.DesiredRevision; got != 2 {
		t.Fatalf("after its own change the server shows revision %d, want 2", got)
	}
	if d := n.desired(t, rev); d.Revision != rev+1 {
		t.Fatalf("after its own change the node has revision %d, want %d", d.Revision, rev+1)
	}
}

// TestCursorsShowNothing: a cursor is opaque: neither the last item's ID
// nor its creation index (a global revision) can be read from it.
func TestCursorsShowNothing(t *testing.T) {
	e := newEnv(t, nil)
	var ids []string
	for i := range 2 {
		pub, _ := newKey(t, "ed25519")
		ids = append(ids, idOf(t, e.req("POST", "/v1/ssh-keys", map[string]any{"name": fmt.Sprintf("k%d", i), "public_key": pub}).must(t, 201)))
	}
	var p struct {
		NextCursor *string `json:"next_cursor"`
	}
	e.req("GET", "/v1/ssh-keys?limit=1", nil).must(t, 200).decode(t, &p)
	if p.NextCursor == nil {
		t.Fatal("no cursor")
	}
	// Whatever its form, nothing in it reads as the ID or a number. A number
	// is looked for in what its base64 parts decode to (the encoded text of
	// random bytes has six digits in a row about once in 700 cursors), or in
	// the cursor itself when nothing in it is base64.
	texts := []string{*p.NextCursor}
	numeric := texts
	for _, part := range strings.FieldsFunc(*p.NextCursor, func(r rune) bool { return r == '.' }) {
		if raw, err := base64.RawURLEncoding.DecodeString(part); err == nil {
			texts = append(texts, string(raw))
		}
	}
	if len(texts) > 1 {
		numeric = texts[1:]
	}
	for _, text := range texts {
		if strings.Contains(text, ids[1]) || strings.Contains(text, ids[1][len("sk_"):]) {
			t.Fatalf("the cursor shows what it points at: %q", text)
		}
	}
	for _, text := range numeric {
		if regexp.MustCompile(`[0-9]{6}`).MatchString(text) {
			t.Fatalf("the cursor shows what it points at: %q", text)
		}
	}
}
