package main

import (
	"context"
	"errors"
	"net"
	"net/http"

	"github.com/hearthd/hearth/client"
)

// Exit codes: scripts rely on them, so they are documented in the README
// ("Exit codes") and fixed by TestExitCodes.
const (
	exitOK          = 0   // done
	exitError       = 1   // any other error: the API refused the request (400, 409 …), a local file, …
	exitUsage       = 2   // bad command line, or no context to connect with
	exitNotFound    = 3   // the server, key, rule or context does not exist (404)
	exitAuth        = 4   // the token is missing, invalid (401) or may not do this (403)
	exitConflict    = 5   // the request conflicts with the state: a name taken, no capacity, a server being deleted (409)
	exitUnavailable = 6   // rate limited (429), the API is unavailable (502–504) or unreachable
	exitFailed      = 7   // --wait: the server turned failed (or is being deleted)
	exitWaitTimeout = 8   // --wait: --wait-timeout passed first; the operation goes on
	exitInterrupted = 130 // interrupted (Ctrl-C); the operation goes on
)

// runError marks an error returned by a command's own code, after cobra
// parsed and checked its command line: anything else is a usage error.
type runError struct{ err error }

func (e runError) Error() string { return e.err.Error() }
func (e runError) Unwrap() error { return e.err }

// usageError is a command line the command itself refuses.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(msg string) error { return usageError{msg: msg} }

// notFoundError is a name that matches nothing (a server, an SSH key, a
// context).
type notFoundError struct{ msg string }

func (e notFoundError) Error() string { return e.msg }

// errWaitTimeout is the cause of a wait's context when --wait-timeout
// passed.
var errWaitTimeout = errors.New("--wait-timeout passed")

// exitCode maps the error a command ended with to its exit code.
func exitCode(err error) int {
	var (
		run   runError
		usage usageError
		nf    notFoundError
		api   client.APIError
		op    *net.OpError
		dns   *net.DNSError
		netE  net.Error
	)
	switch {
	case err == nil:
		return exitOK
	case !errors.As(err, &run), errors.As(err, &usage):
		return exitUsage
	case errors.Is(err, errWaitTimeout):
		return exitWaitTimeout
	case errors.Is(err, client.ErrServerFailed), errors.Is(err, client.ErrServerDeleting):
		return exitFailed
	case errors.Is(err, context.Canceled):
		return exitInterrupted
	case errors.As(err, &nf):
		return exitNotFound
	case errors.As(err, &api):
		return apiExitCode(api)
	case errors.As(err, &op), errors.As(err, &dns), errors.As(err, &netE) && netE.Timeout():
		// Not reached: refused, reset, no such host, timed out. (A
		// certificate the client does not trust is not among them.)
		return exitUnavailable
	}
	return exitError
}

func apiExitCode(e client.APIError) int {
	switch e.StatusCode {
	case http.StatusNotFound:
		return exitNotFound
	case http.StatusUnauthorized, http.StatusForbidden:
		return exitAuth
	case http.StatusConflict:
		return exitConflict
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return exitUnavailable
	}
	return exitError
}
