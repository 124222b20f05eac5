package deployapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm/fake"
)

// browserPage streams a chat completion from the API at API with fetch, as
// a browser app does (the key in Authorization, an SDK's own header, the
// stream read chunk by chunk), and reports what its script could read.
const browserPage = `<!doctype html><title>app</title><script>
async function run(api, key) {
  try {
    const r = await fetch(api + "/chat/completions", {
      method: "POST",
      headers: {"Authorization": "Bearer " + key, "Content-Type": "application/json", "X-Stainless-Lang": "js"},
      body: JSON.stringify({model: "hearth-tiny", stream: true, messages: [{role: "user", content: "hi"}]}),
    });
    const reader = r.body.getReader(), dec = new TextDecoder();
    let text = "", reads = 0;
    for (;;) {
      const {done, value} = await reader.read();
      if (done) break;
      text += dec.decode(value, {stream: true});
      reads++;
    }
    let content = "";
    for (const line of text.split("\n")) {
      if (line.startsWith("data: {")) content += JSON.parse(line.slice(6)).choices[0]?.delta?.content ?? "";
    }
    return JSON.stringify({status: r.status, content, reads, done: text.includes("data: [DONE]"),
      requestId: r.headers.get("X-Request-Id") || "", limit: r.headers.get("x-ratelimit-limit-requests") || ""});
  } catch (e) {
    return JSON.stringify({error: e.name + ": " + e.message});
  }
}
</script>`

type browserResult struct {
	Status    int    `json:"status"`
	Content   string `json:"content"`
	Reads     int    `json:"reads"`
	Done      bool   `json:"done"`
	RequestID string `json:"requestId"`
	Limit     string `json:"limit"`
	Error     string `json:"error"`
}

// A page of another origin streams a chat completion with fetch from a
// real browser (Debian's chromium, headless): the preflight is answered,
// the stream and the exposed headers are readable. The same page calling
// a deployment that allows no origin is refused by the browser.
func TestCORSFromABrowser(t *testing.T) {
	testutil.Integration(t, "Chromium")
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium not found (scripts/ensure-deps.sh installs it): %v", err)
	}
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(browserPage))
	}))
	defer page.Close()

	fc := fake.Config{Tokens: []string{"Hello", " from", " a", " browser"}}
	allowed := startAPI(t, fc, func(c *APIConfig) {
		var err error
		if c.CORS, err = ParseCORSOrigins([]string{page.URL}); err != nil {
			t.Fatal(err)
		}
	})
	allowed.secret, _ = allowed.keys.AddLimited("browser", 60, 0)
	closed := startAPI(t, fc, nil)

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	actx, acancel := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.Flag("disable-dev-shm-usage", true))...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	if _, err := chromedp.Run(bctx, chromedp.Navigate(page.URL)); err != nil {
		t.Fatalf("open the page: %v", err)
	}
	call := func(ta *testAPI) browserResult {
		t.Helper()
		arg, _ := json.Marshal([]string{ta.url, ta.secret})
		out, err := chromedp.Run(bctx, chromedp.Evaluate[string]("run(..."+string(arg)+")", chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatalf("run the page's script: %v", err)
		}
		var r browserResult
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("page result %q: %v", out, err)
		}
		return r
	}

	r := call(allowed)
	if r.Error != "" || r.Status != 200 || r.Content != "Hello from a browser" || !r.Done || r.Reads < 1 ||
		r.RequestID == "" || r.Limit != "60" {
		t.Fatalf("allowed origin: %+v", r)
	}
	if r = call(closed); !strings.HasPrefix(r.Error, "TypeError") {
		t.Fatalf("a deployment that allows no origin: %+v, want the browser to refuse (TypeError)", r)
	}
}
