// Package noredirect keeps credentials from following a redirect. hearth's
// clients of its own APIs (the management API's Go client and CLI, a node's
// client of the control plane) send a bearer token with every request, and
// Go's http.Client resends it to a redirect's target on the same host
// whatever its scheme and port: an HTTPS control plane answering 307 to
// plain HTTP elsewhere would get the token sent in the clear. The APIs
// never redirect, so a redirect is a misconfigured or hostile server: it
// is an error, never followed.
package noredirect

import (
	"errors"
	"fmt"
	"net/http"
)

// Error is a redirect that was not followed.
type Error struct {
	Status   int    // the redirect's status: 301, 302, 303, 307 or 308
	Location string // where it pointed, without a password
}

func (e *Error) Error() string {
	return fmt.Sprintf("the server answered HTTP %d, a redirect to %s, which is not followed: the request's credentials would go with it", e.Status, e.Location)
}

// Is reports whether err comes from a refused redirect.
func Is(err error) bool {
	var e *Error
	return errors.As(err, &e)
}

// Check is an http.Client's CheckRedirect that refuses every redirect.
func Check(req *http.Request, _ []*http.Request) error {
	e := &Error{Location: req.URL.Redacted()}
	if req.Response != nil {
		e.Status = req.Response.StatusCode
	}
	return e
}

// Client returns a copy of hc (a new client if hc is nil), sharing its
// transport, that follows no redirect.
func Client(hc *http.Client) *http.Client {
	c := &http.Client{}
	if hc != nil {
		*c = *hc
	}
	c.CheckRedirect = Check
	return c
}
