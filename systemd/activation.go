package systemd

import (
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"

	"github.com/coreos/go-systemd/v22/activation"
)

// Listeners returns the listening sockets systemd passed to this process
// (socket activation: $LISTEN_FDS for this $LISTEN_PID), in the order of
// the .socket unit, and unsets the variables so children do not take them.
// Passed descriptors that are not listening sockets are left out. Without
// socket activation it returns an empty slice.
func Listeners() ([]net.Listener, error) {
	all, err := activation.Listeners()
	if err != nil {
		return nil, fmt.Errorf("systemd: passed sockets: %w", err)
	}
	out := all[:0]
	for _, ln := range all {
		if ln != nil {
			out = append(out, ln)
		}
	}
	return out, nil
}

// Listen returns the listening socket systemd passed, and true, when the
// process was socket-activated with exactly one socket; otherwise, without
// socket activation, a new TCP listener on addr and false. It is for a
// process with a single listener; with several sockets use PassedSockets and
// pick them by name.
func Listen(addr string) (net.Listener, bool, error) {
	s, err := PassedSockets()
	if err != nil {
		return nil, false, err
	}
	ln, activated, err := s.Listen("", addr)
	// Close whatever was passed but not taken (only in the error case here).
	if cerr := s.Close(); cerr != nil && err == nil {
		ln.Close()
		return nil, false, cerr
	}
	return ln, activated, err
}

// Sockets are the listening sockets systemd passed to this process, keyed
// by their FileDescriptorName= (the .socket unit's name when unset). Take
// them once, early in main, with PassedSockets; hand each to its server
// with Listen; Close the rest. Safe for concurrent use.
type Sockets struct {
	mu     sync.Mutex
	byName map[string][]net.Listener
}

// PassedSockets takes the sockets systemd passed ($LISTEN_FDS,
// $LISTEN_PID, $LISTEN_FDNAMES) and unsets those variables, so they are
// neither taken twice nor inherited by children. Without socket activation
// the result is empty and every Listen falls back to a plain listen.
func PassedSockets() (*Sockets, error) {
	s := &Sockets{byName: map[string][]net.Listener{}}
	var errs []error
	for _, f := range activation.Files(true) {
		ln, err := net.FileListener(f)
		// FileListener dups the descriptor; the original is not needed
		// either way.
		f.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("systemd: passed socket %q is not a listening stream socket: %w", f.Name(), err))
			continue
		}
		s.byName[f.Name()] = append(s.byName[f.Name()], ln)
	}
	if len(errs) > 0 {
		s.Close()
		return nil, errors.Join(errs...)
	}
	return s, nil
}

// Names lists the names of the passed sockets not yet taken, sorted.
func (s *Sockets) Names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.namesLocked()
}

// Listen hands out the passed socket called name and true. Name "" takes
// the only passed socket, whatever its name, and fails if several were
// passed. When no socket by that name was passed it listens on TCP addr
// itself and returns false, so the daemon works with and without its
// .socket unit. Each passed socket is handed out once.
func (s *Sockets) Listen(name, addr string) (net.Listener, bool, error) {
	s.mu.Lock()
	ln, err := s.take(name)
	s.mu.Unlock()
	if err != nil {
		return nil, false, err
	}
	if ln != nil {
		return ln, true, nil
	}
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		return nil, false, fmt.Errorf("systemd: listen on %s: %w", addr, err)
	}
	return ln, false, nil
}

// take removes and returns the socket for name, nil if there is none.
func (s *Sockets) take(name string) (net.Listener, error) {
	if name == "" {
		switch n := s.count(); {
		case n == 0:
			return nil, nil
		case n > 1:
			return nil, fmt.Errorf("systemd: %d sockets passed (%s); pick one by name", n, strings.Join(s.namesLocked(), ", "))
		}
		for n := range s.byName {
			name = n
		}
	}
	lns := s.byName[name]
	if len(lns) == 0 {
		return nil, nil
	}
	if len(lns) > 1 {
		return nil, fmt.Errorf("systemd: %d sockets passed under the name %q; give each its own FileDescriptorName=", len(lns), name)
	}
	delete(s.byName, name)
	return lns[0], nil
}

func (s *Sockets) count() int {
	n := 0
	for _, lns := range s.byName {
		n += len(lns)
	}
	return n
}

func (s *Sockets) namesLocked() []string {
	names := make([]string, 0, len(s.byName))
	for n := range s.byName {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Close closes the passed sockets that were not handed out by Listen, so a
// socket the daemon does not use does not sit accepting connections nobody
// serves.
func (s *Sockets) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for name, lns := range s.byName {
		for _, ln := range lns {
			if err := ln.Close(); err != nil {
				errs = append(errs, fmt.Errorf("systemd: close passed socket %q: %w", name, err))
			}
		}
		delete(s.byName, name)
	}
	return errors.Join(errs...)
}
