package promtest

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestStartScrapesTargetsByPathAndReportsDownTargets(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/custom/path", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		w.Write([]byte("# TYPE promtest_answer gauge\npromtest_answer 42\n"))
	})
	good := httptest.NewServer(mux)
	defer good.Close()
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "broken", http.StatusInternalServerError)
	}))
	defer bad.Close()

	p := Start(t, good.URL+"/custom/path", strings.TrimPrefix(bad.URL, "http://"))
	if len(p.Jobs) != 2 || p.Jobs[0] != "target0" || p.Jobs[1] != "target1" {
		t.Fatalf("jobs %v", p.Jobs)
	}
	p.WaitFor(t, `promtest_answer{job="target0"}`, func(v float64) bool { return v == 42 }, 30*time.Second)
	p.WaitFor(t, `up{job="target1"}`, func(v float64) bool { return v == 0 }, 30*time.Second)
	if got := p.Query(t, `up{job="target0"}`); got != 1 {
		t.Fatalf("up of the good target = %v", got)
	}
	if got := p.Query(t, `promtest_no_such_metric`); !math.IsNaN(got) {
		t.Fatalf("empty result = %v, want NaN", got)
	}
	if _, err := p.TryQuery(t.Context(), `promtest_no_such_metric`); !errors.Is(err, ErrNoData) {
		t.Fatalf("TryQuery on an empty result: %v", err)
	}
	if _, err := p.TryQuery(t.Context(), `up`); err == nil {
		t.Fatal("TryQuery accepted two series")
	}
	if got := p.Query(t, `scalar(vector(7))`); got != 7 {
		t.Fatalf("scalar = %v", got)
	}

	// A condition that never holds fails the test with the target health.
	rec := &fatalRecorder{TB: t}
	if v := p.WaitFor(rec, `up{job="target1"}`, func(v float64) bool { return v == 1 }, time.Second); !math.IsNaN(v) {
		t.Fatalf("WaitFor returned %v after failing", v)
	}
	if !strings.Contains(rec.msg, "not satisfied") || !strings.Contains(rec.msg, "health=down") ||
		!strings.Contains(rec.msg, "500") {
		t.Fatalf("failure message lacks the target health:\n%s", rec.msg)
	}
}

// fatalRecorder records Fatalf instead of ending the test.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Fatalf(format string, args ...any) { r.msg = fmt.Sprintf(format, args...) }

func TestCleanupStopsPrometheus(t *testing.T) {
	var pid int
	t.Run("inner", func(t *testing.T) {
		p := Start(t)
		pid = p.pid
		if !alive(pid) {
			t.Fatalf("prometheus %d not running", pid)
		}
	})
	if alive(pid) {
		t.Fatalf("prometheus %d still running after its test ended", pid)
	}
}

// alive reports whether pid is a running (not zombie) process.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}
