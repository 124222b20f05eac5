package console

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/hearthd/hearth/client"
)

const cookieName = "hearth_console"

// session is one signed-in browser. The token stays here: the browser
// holds only the session's random ID.
type session struct {
	token    string
	ident    Identity
	csrf     string
	created  time.Time
	lastSeen time.Time
	api      *client.Client

	mu    sync.Mutex
	flash flash // shown once by the next page
}

// sessions holds the signed-in sessions in memory, keyed by the SHA-256 of
// their ID, so the map holds nothing a cookie can be rebuilt from. A
// restart of the control plane signs everyone out.
type sessions struct {
	mu      sync.Mutex
	byHash  map[string]*session
	idle    time.Duration
	maxAge  time.Duration
	max     int
	now     func() time.Time
	counter int
}

func newSessions(idle, maxAge time.Duration, max int, now func() time.Time) *sessions {
	return &sessions{byHash: map[string]*session{}, idle: idle, maxAge: maxAge, max: max, now: now}
}

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b)
}

func hashID(id string) string {
	h := sha256.Sum256([]byte(id))
	return hex.EncodeToString(h[:])
}

// create starts a session and returns its ID (the cookie's value).
func (s *sessions) create(token string, ident Identity, api *client.Client) (string, *session) {
	id := randomToken()
	now := s.now()
	ss := &session{token: token, ident: ident, csrf: randomToken(), created: now, lastSeen: now, api: api}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(now)
	for len(s.byHash) >= s.max {
		var oldest string
		for h, o := range s.byHash {
			if oldest == "" || o.created.Before(s.byHash[oldest].created) {
				oldest = h
			}
		}
		delete(s.byHash, oldest)
	}
	s.byHash[hashID(id)] = ss
	return id, ss
}

// expireLocked drops expired sessions; it walks the map at most once per
// hundred calls.
func (s *sessions) expireLocked(now time.Time) {
	s.counter++
	if s.counter%100 != 1 {
		return
	}
	for h, ss := range s.byHash {
		if s.expired(ss, now) {
			delete(s.byHash, h)
		}
	}
}

func (s *sessions) expired(ss *session, now time.Time) bool {
	return now.Sub(ss.lastSeen) > s.idle || now.Sub(ss.created) > s.maxAge
}

// get returns the live session of id and marks it used, or nil.
func (s *sessions) get(id string) *session {
	if id == "" {
		return nil
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	h := hashID(id)
	ss := s.byHash[h]
	if ss == nil {
		return nil
	}
	if s.expired(ss, now) {
		delete(s.byHash, h)
		return nil
	}
	ss.lastSeen = now
	return ss
}

// revoke ends the session of id.
func (s *sessions) revoke(id string) {
	s.mu.Lock()
	delete(s.byHash, hashID(id))
	s.mu.Unlock()
}

// links are one-time sign-in links: a code that signs in with a token once,
// within its TTL (make run prints one).
type links struct {
	mu   sync.Mutex
	byID map[string]linkRec
	ttl  time.Duration
	now  func() time.Time
}

type linkRec struct {
	token   string
	expires time.Time
}

func newLinks(ttl time.Duration, now func() time.Time) *links {
	return &links{byID: map[string]linkRec{}, ttl: ttl, now: now}
}

func (l *links) issue(token string) string {
	code := randomToken()
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for h, r := range l.byID {
		if now.After(r.expires) {
			delete(l.byID, h)
		}
	}
	l.byID[hashID(code)] = linkRec{token: token, expires: now.Add(l.ttl)}
	return code
}

// redeem returns the token of code and forgets the code.
func (l *links) redeem(code string) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := hashID(code)
	r, ok := l.byID[h]
	delete(l.byID, h)
	if !ok || l.now().After(r.expires) {
		return "", false
	}
	return r.token, true
}

// secureRequest says whether the session cookie must be Secure: always,
// unless the console is reached on a loopback address over plain HTTP
// (make run, tests), where a browser would not send a Secure cookie back.
func secureRequest(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	host, _, err := net.SplitHostPort(r.Host)
	if err != nil {
		host = r.Host
	}
	if host == "localhost" {
		return false
	}
	ip := net.ParseIP(host)
	return ip == nil || !ip.IsLoopback()
}

func setSessionCookie(w http.ResponseWriter, r *http.Request, id string, maxAge time.Duration) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: id, Path: "/console/", HttpOnly: true,
		Secure: secureRequest(r), SameSite: http.SameSiteStrictMode, MaxAge: int(maxAge.Seconds())})
}

func clearSessionCookie(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/console/", HttpOnly: true,
		Secure: secureRequest(r), SameSite: http.SameSiteStrictMode, MaxAge: -1})
}

// sameOrigin checks a state-changing request's Origin (or, without one,
// its Referer) against the console's own host. Behind a proxy that ends
// TLS the console sees plain HTTP for an https origin, so the scheme is
// checked only when the console serves TLS itself.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		o = r.Header.Get("Referer")
	}
	u, err := url.Parse(o)
	if err != nil || u.Host != r.Host || (u.Scheme != "https" && (u.Scheme != "http" || r.TLS != nil)) {
		return false
	}
	return true
}

// validCSRF checks the form's CSRF token against the session's.
func validCSRF(r *http.Request, ss *session) bool {
	got := r.PostFormValue("csrf")
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(ss.csrf)) == 1
}
