package control

import (
	"errors"
	"net/http"
)

// TokenIdentity is what a management API token is: its project and scope.
type TokenIdentity struct {
	Project     string
	ProjectName string
	Scope       string // ScopeReadWrite or ScopeReadOnly
}

// ErrInvalidToken is TokenIdentity's answer for a token the API would
// refuse with 401.
var ErrInvalidToken = errors.New("missing or invalid API token")

// TokenIdentity authenticates token as the management API does, for the
// web console's sign-in: the console shows the project and greys out
// writes for a read-only token, and then acts through the API itself with
// the token, so this reads nothing a request with the token could not.
func (s *Server) TokenIdentity(token string) (TokenIdentity, error) {
	r := &http.Request{Header: http.Header{"Authorization": {"Bearer " + token}}}
	tok, aerr := s.authenticate(r, false)
	if aerr != nil {
		if aerr.status == http.StatusUnauthorized {
			return TokenIdentity{}, ErrInvalidToken
		}
		return TokenIdentity{}, aerr
	}
	return TokenIdentity{Project: tok.Project, ProjectName: s.projectName(tok.Project), Scope: tok.Scope}, nil
}
