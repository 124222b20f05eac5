package main

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hearthd/hearth/control"
	"github.com/hearthd/hearth/internal/config"
	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/store"
)

// operatorCommands are the commands besides serve, by noun and verb.
var operatorCommands = map[string]map[string]func(*operator, []string) error{
	"projects":          {"create": projectsCreate, "list": projectsList},
	"tokens":            {"create": tokensCreate, "list": tokensList, "revoke": tokensRevoke},
	"enrollment-tokens": {"create": enrollmentTokensCreate},
	"nodes":             {"list": nodesList},
}

// operator is one operator command being run: its flags, and where the
// running server's admin socket and, when it is down, the state are.
type operator struct {
	ctx            context.Context
	name           string // e.g. "tokens create"
	cfg            settings
	ld             *config.Loader
	fs             *flag.FlagSet
	stdout, stderr io.Writer
}

// operate runs an operator command. The state directory and socket come
// from the same file and environment as hearth-control serve's.
func operate(ctx context.Context, name string, cmd func(*operator, []string) error, args []string, stdout, stderr io.Writer) error {
	o := &operator{ctx: ctx, name: name, cfg: defaults(), stdout: stdout, stderr: stderr}
	o.ld = loader(&o.cfg)
	o.fs = flag.NewFlagSet(name, flag.ContinueOnError)
	o.fs.SetOutput(stderr)
	o.ld.AddFlags(o.fs, "state-dir", "admin-socket", "database-url")
	return cmd(o, args)
}

// parse parses the command's flags, defined on o.fs beforehand, and
// returns its n positional arguments, which may come before the flags
// (`tokens revoke ID --state-dir D`) or after them.
func (o *operator) parse(args []string, n int) ([]string, error) {
	var pos []string
	for len(args) > 0 && !strings.HasPrefix(args[0], "-") && len(pos) < n {
		pos, args = append(pos, args[0]), args[1:]
	}
	if _, err := o.ld.Load(o.fs, args, os.Environ()); err != nil {
		return nil, err
	}
	pos = append(pos, o.fs.Args()...)
	if len(pos) != n {
		return nil, fmt.Errorf("%s takes %d argument(s), got %d: %q", o.name, n, len(pos), pos)
	}
	return pos, nil
}

// do sends one request to the running server's admin socket or, when none
// runs, does the same on the store (Pebble allows one process, so one of
// the two is always the only writer). On a shared database it works on the
// database directly, holding the writer lock like a replica's change.
func (o *operator) do(method, path string, in, out any, offline func(store.KV) error) error {
	if o.cfg.DatabaseURL == "" {
		err := control.AdminCall(o.ctx, o.cfg.adminSocketPath(), method, path, in, out)
		if !errors.Is(err, control.ErrAdminUnavailable) {
			return err
		}
	}
	st, err := openStore(o.ctx, o.cfg, nil)
	if err != nil {
		if o.cfg.DatabaseURL == "" {
			return fmt.Errorf("control plane not running and its state is unavailable: %w", err)
		}
		return err
	}
	defer st.Close()
	if o.cfg.DatabaseURL != "" {
		// A fresh database gets its layout (and default project) first.
		if err := control.Migrate(st, time.Now()); err != nil {
			return err
		}
	}
	w, unlock, err := store.Lock(o.ctx, st)
	if err != nil {
		return err
	}
	defer unlock()
	return offline(w)
}

// table writes rows aligned in columns, the first row the header.
func (o *operator) table(rows [][]string) error {
	tw := tabwriter.NewWriter(o.stdout, 0, 0, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

func (o *operator) json(v any) error {
	enc := json.NewEncoder(o.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func projectsCreate(o *operator, args []string) error {
	name := o.fs.String("name", "", "project name: 1 to 63 lowercase letters, digits or '-'")
	if _, err := o.parse(args, 0); err != nil {
		return err
	}
	if *name == "" {
		return errors.New("projects create needs --name")
	}
	var p control.Project
	err := o.do(http.MethodPost, "/admin/projects", control.AdminProjectRequest{Name: *name}, &p, func(st store.KV) (err error) {
		p, err = control.CreateProject(st, *name, time.Now())
		return err
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(o.stderr, "project %s (%s) created\n", p.ID, p.Name)
	fmt.Fprintln(o.stdout, p.ID)
	return nil
}

func projectsList(o *operator, args []string) error {
	asJSON := o.fs.Bool("json", false, "print JSON instead of a table")
	if _, err := o.parse(args, 0); err != nil {
		return err
	}
	var ps []control.Project
	err := o.do(http.MethodGet, "/admin/projects", nil, &ps, func(st store.KV) (err error) {
		ps, err = control.ListProjects(st)
		return err
	})
	if err != nil {
		return err
	}
	if *asJSON {
		return o.json(ps)
	}
	rows := [][]string{{"ID", "NAME", "CREATED"}}
	for _, p := range ps {
		rows = append(rows, []string{p.ID, p.Name, p.CreatedAt.Format(time.RFC3339)})
	}
	return o.table(rows)
}

func tokensCreate(o *operator, args []string) error {
	spec := control.TokenSpec{}
	o.fs.StringVar(&spec.Project, "project", "", "the project the token acts for: its ID or name (see projects list)")
	o.fs.StringVar(&spec.Name, "name", "default", "token name, to tell tokens apart in tokens list")
	o.fs.BoolVar(&spec.ReadOnly, "read-only", false, "the token may only read (GET) its project")
	if _, err := o.parse(args, 0); err != nil {
		return err
	}
	if spec.Project == "" {
		return errors.New("tokens create needs --project: the ID or name of the project the token acts for (see projects list)")
	}
	var t control.NewAPIToken
	err := o.do(http.MethodPost, "/admin/tokens", spec, &t, func(st store.KV) (err error) {
		t, err = control.CreateToken(st, spec, time.Now())
		return err
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(o.stderr, "API token %s (%s, %s) created in project %s (%s); it is shown only once:\n",
		t.ID, t.Name, t.Scope, t.ProjectName, t.Project)
	fmt.Fprintln(o.stdout, t.Token)
	return nil
}

func tokensList(o *operator, args []string) error {
	project := o.fs.String("project", "", "only this project's tokens (ID or name)")
	asJSON := o.fs.Bool("json", false, "print JSON instead of a table")
	if _, err := o.parse(args, 0); err != nil {
		return err
	}
	var ts []control.TokenInfo
	path := "/admin/tokens?" + url.Values{"project": {*project}}.Encode()
	err := o.do(http.MethodGet, path, nil, &ts, func(st store.KV) (err error) {
		ts, err = control.ListTokens(st, *project)
		return err
	})
	if err != nil {
		return err
	}
	if *asJSON {
		return o.json(ts)
	}
	rows := [][]string{{"ID", "NAME", "PROJECT", "SCOPE", "CREATED", "LAST USED"}}
	for _, t := range ts {
		used := "never"
		if t.LastUsedAt != nil {
			used = t.LastUsedAt.Format(time.RFC3339)
		}
		rows = append(rows, []string{t.ID, t.Name, t.ProjectName, t.Scope, t.CreatedAt.Format(time.RFC3339), used})
	}
	return o.table(rows)
}

func tokensRevoke(o *operator, args []string) error {
	pos, err := o.parse(args, 1)
	if err != nil {
		return err
	}
	id := pos[0]
	err = o.do(http.MethodDelete, "/admin/tokens/"+url.PathEscape(id), nil, nil, func(st store.KV) error {
		return control.RevokeToken(st, id)
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(o.stdout, "API token %s revoked\n", id)
	return nil
}

func enrollmentTokensCreate(o *operator, args []string) error {
	uses := o.fs.Int("uses", 1, "how many nodes may enroll with the token")
	ttl := o.fs.Duration("ttl", 24*time.Hour, "lifetime of the token")
	o.ld.AddFlags(o.fs, "tls-cert")
	if _, err := o.parse(args, 0); err != nil {
		return err
	}
	var t control.NewEnrollmentToken
	in := control.AdminEnrollmentRequest{Uses: *uses, TTLSeconds: ttl.Seconds()}
	err := o.do(http.MethodPost, "/admin/enrollment-tokens", in, &t, func(st store.KV) (err error) {
		t, err = control.CreateEnrollmentToken(st, *uses, *ttl, time.Now())
		return err
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(o.stderr, "enrollment token %s created for %d node(s), valid until %s; it is shown only once:\n",
		t.ID, t.Uses, t.ExpiresAt.Format(time.RFC3339))
	fmt.Fprintln(o.stdout, t.Token)
	o.printPin()
	return nil
}

// printPin tells the operator the fingerprint a node enrolling over HTTPS
// can pin, when the control plane has a certificate.
func (o *operator) printPin() {
	if o.cfg.TLSCert == "" {
		return
	}
	b, err := os.ReadFile(o.cfg.TLSCert)
	block, _ := pem.Decode(b)
	if err != nil || block == nil || block.Type != "CERTIFICATE" {
		fmt.Fprintf(o.stderr, "warning: no certificate to take the fingerprint of in %s (%v)\n", o.cfg.TLSCert, err)
		return
	}
	fmt.Fprintf(o.stderr, "nodes verify this control plane with --control-cert-sha256 %s (or --control-ca-file with its CA)\n",
		nodeapi.CertSHA256(block.Bytes))
}

func nodesList(o *operator, args []string) error {
	if _, err := o.parse(args, 0); err != nil {
		return err
	}
	var nodes []control.NodeInfo
	err := o.do(http.MethodGet, "/admin/nodes", nil, &nodes, func(st store.KV) (err error) {
		nodes, err = control.ListNodes(st)
		return err
	})
	if err != nil {
		return err
	}
	return o.json(nodes)
}

func auditLog(o *operator, args []string) error {
	project := o.fs.String("project", "", "only this project's log (ID or name)")
	since := o.fs.String("since", "", "entries from this time on: RFC 3339, or a duration ago such as 24h")
	until := o.fs.String("until", "", "entries before this time: RFC 3339, or a duration ago")
	limit := o.fs.Int("limit", 50, "at most this many entries, the newest")
	asJSON := o.fs.Bool("json", false, "print JSON instead of a table")
	if _, err := o.parse(args, 0); err != nil {
		return err
	}
	now := time.Now()
	from, err := pastTime(*since, now)
	if err != nil {
		return fmt.Errorf("--since: %w", err)
	}
	to, err := pastTime(*until, now)
	if err != nil {
		return fmt.Errorf("--until: %w", err)
	}
	if *limit < 1 {
		return errors.New("--limit must be at least 1")
	}
	q := url.Values{"project": {*project}, "limit": {strconv.Itoa(*limit)}}
	if !from.IsZero() {
		q.Set("since", from.Format(time.RFC3339Nano))
	}
	if !to.IsZero() {
		q.Set("until", to.Format(time.RFC3339Nano))
	}
	var entries []control.AuditEntry
	err = o.do(http.MethodGet, "/admin/audit-log?"+q.Encode(), nil, &entries, func(st store.KV) (err error) {
		entries, err = control.ListAudit(st, *project, from, to, *limit)
		return err
	})
	if err != nil {
		return err
	}
	if *asJSON {
		return o.json(entries)
	}
	rows := [][]string{{"TIME", "PROJECT", "TOKEN", "SOURCE", "REQUEST", "STATUS", "RESOURCES"}}
	for _, e := range entries {
		rows = append(rows, []string{e.At.Format(time.RFC3339), e.Project, e.TokenID + " (" + e.TokenName + ")", e.Source,
			e.Method + " " + e.Path, strconv.Itoa(e.Status), strings.Join(e.ResourceIDs, ",")})
	}
	return o.table(rows)
}

// pastTime reads an RFC 3339 time, or a duration before now; "" is the
// zero time (no bound).
func pastTime(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time nor a duration such as 24h", s)
	}
	return now.Add(-d), nil
}
