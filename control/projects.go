package control

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hearthd/hearth/store"
)

// Project is a project as the operator commands show it.
type Project struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
}

// TokenSpec is what a new management API token is made for.
type TokenSpec struct {
	// Project is the project's ID or name.
	Project  string `json:"project"`
	Name     string `json:"name"`
	ReadOnly bool   `json:"read_only"`
}

// NewAPIToken is a freshly made management API token. Token is shown once;
// only its hash is stored.
type NewAPIToken struct {
	ID          string `json:"id"`
	Name        string `json:"name"`
	Project     string `json:"project"`
	ProjectName string `json:"project_name"`
	Scope       string `json:"scope"`
	Token       string `json:"token"`
}

// TokenInfo describes a management API token for operators: never its
// secret, which is not stored.
type TokenInfo struct {
	ID          string     `json:"id"`
	Name        string     `json:"name"`
	Project     string     `json:"project"`
	ProjectName string     `json:"project_name"`
	Scope       string     `json:"scope"`
	CreatedAt   time.Time  `json:"created_at"`
	LastUsedAt  *time.Time `json:"last_used_at"`
}

// Errors of the operator commands, for the admin socket's status codes.
var (
	ErrUnknownProject = errors.New("no such project")
	ErrUnknownToken   = errors.New("no such API token")
	ErrProjectExists  = errors.New("a project with this name already exists")
	ErrInvalid        = errors.New("invalid input")
)

// opError is an operator command's error: its own message, and one of the
// errors above as its kind.
type opError struct {
	kind error
	msg  string
}

func (e *opError) Error() string { return e.msg }
func (e *opError) Unwrap() error { return e.kind }

func opErr(kind error, format string, args ...any) error {
	return &opError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// CreateProject stores a new project. Names are DNS labels (they can be
// part of a deployment URL, see "{project}") and unique. The store-level
// functions here serve the CLI while the server is down and, through its
// admin socket, while it runs (under its change lock).
func CreateProject(st store.KV, name string, now time.Time) (Project, error) {
	if err := Migrate(st, now); err != nil {
		return Project{}, err
	}
	if !namePattern.MatchString(name) {
		return Project{}, opErr(ErrInvalid, "project name must be 1 to 63 lowercase letters, digits or '-', starting and ending with a letter or digit")
	}
	switch ok, err := st.Has(pfxProjectName + name); {
	case err != nil:
		return Project{}, err
	case ok:
		return Project{}, opErr(ErrProjectExists, "a project named %q already exists", name)
	}
	p := projectRec{ID: newID(prefixProject), Name: name, CreatedAt: now.UTC()}
	b := st.NewBatch()
	if err := b.Put(pfxProject+p.ID, p); err != nil {
		b.Discard()
		return Project{}, err
	}
	if err := b.Put(pfxProjectName+p.Name, p.ID); err != nil {
		b.Discard()
		return Project{}, err
	}
	if err := b.Commit(); err != nil {
		return Project{}, fmt.Errorf("store project: %w", err)
	}
	return Project(p), nil
}

// ListProjects returns every project, oldest first.
func ListProjects(st store.KV) ([]Project, error) {
	if err := Migrate(st, time.Now()); err != nil {
		return nil, err
	}
	out := []Project{}
	err := store.ScanJSON(st, pfxProject, func(_ string, p projectRec) (bool, error) {
		out = append(out, Project(p))
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list projects: %w", err)
	}
	sortByCreation(out, func(p Project) (time.Time, string) { return p.CreatedAt, p.ID })
	return out, nil
}

// sortByCreation orders operator listings oldest first, by ID on a tie.
func sortByCreation[T any](items []T, key func(T) (time.Time, string)) {
	slices.SortFunc(items, func(a, b T) int {
		at, aid := key(a)
		bt, bid := key(b)
		if c := at.Compare(bt); c != 0 {
			return c
		}
		return strings.Compare(aid, bid)
	})
}

// findProject resolves a project by ID or name.
func findProject(st store.KV, ref string) (projectRec, error) {
	var p projectRec
	id := ref
	if !validID(ref, prefixProject) {
		if err := st.Get(pfxProjectName+ref, &id); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return p, opErr(ErrUnknownProject, "no project %q (give a project ID or name; see projects list)", ref)
			}
			return p, err
		}
	}
	if err := st.Get(pfxProject+id, &p); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return p, opErr(ErrUnknownProject, "no project %q (give a project ID or name; see projects list)", ref)
		}
		return p, err
	}
	return p, nil
}

// CreateToken stores a new management API token for a project.
func CreateToken(st store.KV, spec TokenSpec, now time.Time) (NewAPIToken, error) {
	if err := Migrate(st, now); err != nil {
		return NewAPIToken{}, err
	}
	if !validName(spec.Name) {
		return NewAPIToken{}, opErr(ErrInvalid, "token name must be 1 to %d characters without control or invisible characters (such as bidi overrides or blank fillers) or surrounding spaces", maxKeyNameLen)
	}
	if spec.Project == "" {
		return NewAPIToken{}, opErr(ErrInvalid, "a token needs a project (--project ID or name)")
	}
	p, err := findProject(st, spec.Project)
	if err != nil {
		return NewAPIToken{}, err
	}
	scope := ScopeReadWrite
	if spec.ReadOnly {
		scope = ScopeReadOnly
	}
	id, tok := newID(prefixAPIToken), newSecret(secretAPIToken)
	h := hashSecret(tok)
	rec := tokenRec{ID: id, Name: spec.Name, Hash: h, Project: p.ID, Scope: scope, CreatedAt: now.UTC()}
	b := st.NewBatch()
	err = b.Put(pfxAPIToken+h, rec)
	if err == nil {
		err = b.Put(pfxAPITokenID+id, h)
	}
	if err == nil {
		err = b.Put(keysOf(p.ID).tokens()+id, h)
	}
	if err != nil {
		b.Discard()
		return NewAPIToken{}, err
	}
	if err := b.Commit(); err != nil {
		return NewAPIToken{}, fmt.Errorf("store API token: %w", err)
	}
	return NewAPIToken{ID: id, Name: spec.Name, Project: p.ID, ProjectName: p.Name, Scope: scope, Token: tok}, nil
}

// CreateAPIToken stores a new read-write token in the default project: the
// one project of a state used by a single customer, and of tests.
func CreateAPIToken(st store.KV, name string, now time.Time) (NewAPIToken, error) {
	return CreateToken(st, TokenSpec{Project: DefaultProject, Name: name}, now)
}

// ListTokens returns the tokens of one project (by ID or name), or of all
// projects when project is "", oldest first.
func ListTokens(st store.KV, project string) ([]TokenInfo, error) {
	if err := Migrate(st, time.Now()); err != nil {
		return nil, err
	}
	idx := pfxAPITokenID
	if project != "" {
		p, err := findProject(st, project)
		if err != nil {
			return nil, err
		}
		idx = keysOf(p.ID).tokens()
	}
	names := map[string]string{}
	out := []TokenInfo{}
	err := st.Scan(idx, "", false, func(_ string, val []byte) (bool, error) {
		var h string
		if err := json.Unmarshal(val, &h); err != nil {
			return false, err
		}
		var t tokenRec
		if err := st.Get(pfxAPIToken+h, &t); err != nil {
			return false, fmt.Errorf("load token: %w", err)
		}
		name, ok := names[t.Project]
		if !ok {
			var p projectRec
			if err := st.Get(pfxProject+t.Project, &p); err != nil {
				return false, fmt.Errorf("load project of token %s: %w", t.ID, err)
			}
			name, names[t.Project] = p.Name, p.Name
		}
		out = append(out, TokenInfo{ID: t.ID, Name: t.Name, Project: t.Project, ProjectName: name, Scope: t.Scope,
			CreatedAt: t.CreatedAt, LastUsedAt: t.LastUsedAt})
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	sortByCreation(out, func(t TokenInfo) (time.Time, string) { return t.CreatedAt, t.ID })
	return out, nil
}

// RevokeToken deletes a token by ID; the next request with it is refused.
// Its Idempotency-Key answers go with it.
func RevokeToken(st store.KV, id string) error {
	if err := Migrate(st, time.Now()); err != nil {
		return err
	}
	var h string
	if err := st.Get(pfxAPITokenID+id, &h); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return opErr(ErrUnknownToken, "no API token %q (see tokens list)", id)
		}
		return err
	}
	var t tokenRec
	if err := st.Get(pfxAPIToken+h, &t); err != nil {
		return fmt.Errorf("load token %s: %w", id, err)
	}
	b := st.NewBatch()
	b.Delete(pfxAPIToken + h)
	b.Delete(pfxAPITokenID + id)
	b.Delete(keysOf(t.Project).tokens() + id)
	err := st.Scan(pfxIdempotency+id+"/", "", false, func(key string, _ []byte) (bool, error) {
		b.Delete(key)
		return true, nil
	})
	if err != nil {
		b.Discard()
		return err
	}
	if err := b.Commit(); err != nil {
		return fmt.Errorf("revoke token %s: %w", id, err)
	}
	return nil
}

// projectName is a project's name for "{project}" in deployment URLs. The
// cache is complete: New loads every project, and the admin socket adds
// those made while the server runs (the only other way to make one is the
// CLI while the server is down).
func (s *Server) projectName(id string) string {
	s.projMu.Lock()
	defer s.projMu.Unlock()
	if name, ok := s.projNames[id]; ok {
		return name
	}
	var p projectRec
	if err := s.st.Get(pfxProject+id, &p); err != nil {
		s.log.Error("load project", "project", id, "err", err)
		return id
	}
	s.projNames[id] = p.Name
	return p.Name
}

// loadProjectNames fills the project name cache at start.
func (s *Server) loadProjectNames() error {
	s.projMu.Lock()
	defer s.projMu.Unlock()
	return store.ScanJSON(s.st, pfxProject, func(_ string, p projectRec) (bool, error) {
		s.projNames[p.ID] = p.Name
		return true, nil
	})
}
