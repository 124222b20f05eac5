package e2e

import (
	"context"
	_ "embed"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/hearthd/hearth/internal/testutil"
)

//go:embed testdata/axe-core/axe.min.js
var axeJS string

// The web console in a real Chromium (Debian's chromium, driven by
// chromedp) against a real control plane and a real node serving the tiny
// model: sign in, add an SSH key, a refused create (the API's message
// beside the name), create a deployment and watch it turn running, create
// an API key and read its secret once, chat in the playground with tokens
// streaming from the deployment API and stop a long answer (where hearthd
// can allow the console's origin; else the page must say why the browser
// was refused), a refused and an added firewall rule,
// delete it, the usage of a request charted hour by hour and day by day
// with its table, every change listed as done, revoke the key, delete the
// server after a confirmation naming it, sign out. Every page passes axe-core with no serious or critical
// violation, every enabled control is reached by Tab, and every page fits
// a 375 px wide screen. With HEARTH_CONSOLE_SCREENSHOTS set to a directory
// (make console-screenshots), each page is saved there.
func TestConsoleBrowser(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium is not installed (scripts/ensure-deps.sh installs it): ", err)
	}
	inst := shared.ollama.Get(t)
	addr, err := testutil.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	ctl := startControl(t, append(append([]string{}, noRateLimit...), "--public-deployment-url-template", "http://"+addr+"/api/v1")...)
	args := []string{"--listen", addr, "--model", inst.Model, "--ollama-url", inst.URL, "--control-url", ctl.url,
		"--enrollment-token", ctl.enrollmentToken(1), "--node-chip", "cpu", "--node-ram", "8", "--node-storage", "40",
		"--authorized-keys-file", filepath.Join(t.TempDir(), "authorized_keys")}
	// The playground's browser calls the deployment API from the console's
	// origin, which the deployment must allow.
	cors := hearthdHasFlag(t, "cors-allowed-origins")
	if cors {
		args = append(args, "--cors-allowed-origins", ctl.url)
	}
	node := startHearthd(t, hearthdOpts{stateDir: t.TempDir(), ready: true, args: args})
	testutil.WaitFor(t, 30*time.Second, "node enrolled", func() bool { return len(ctl.nodes()) == 1 })

	shots := os.Getenv("HEARTH_CONSOLE_SCREENSHOTS")
	// Usage over time shows once the node has sealed the minute of a
	// request and reported it: up to a minute and a report more.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	actx, acancel := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.WindowSize(1280, 900))...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()

	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// nav runs steps that load another page (a link, a form) and returns
	// once it has loaded, with its HTTP status.
	nav := func(what string, steps ...chromedp.Action[chromedp.Void]) int64 {
		t.Helper()
		resp, err := chromedp.RunResponse(bctx, steps...)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return resp.Status
	}
	eval := func(what, js string) string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[string](js, chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return v
	}
	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.TextContent(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return v
	}
	// check runs axe-core on the page, tabs through its controls, checks it
	// fits 375 px, and saves a screenshot when asked.
	check := func(name string) {
		t.Helper()
		eval("inject axe-core", axeJS+";'ok'")
		v := eval("axe on "+name, `axe.run(document, {resultTypes: ["violations"]}).then(r => JSON.stringify(
			r.violations.filter(v => v.impact === "serious" || v.impact === "critical")
				.map(v => ({id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.map(n => n.target.join(" "))}))))`)
		if v != "[]" {
			t.Errorf("page %s: axe-core violations: %s", name, v)
		}
		// Every enabled control is reached by the Tab key, in turn.
		n := eval("controls", `(() => {
			let i = 0;
			for (const e of document.querySelectorAll("a[href], button, input, select, textarea, [tabindex]")) {
				if (e.disabled || e.type === "hidden" || e.closest("fieldset:disabled") || e.tabIndex < 0 || !e.getClientRects().length) continue;
				e.dataset.kb = String(i++);
			}
			document.activeElement && document.activeElement.blur();
			return String(i);
		})()`)
		// A date input takes a Tab per field of its own: give every
		// control a few.
		reached := map[string]bool{}
		for i := 0; i < 6*atoi(n)+6 && len(reached) <= atoi(n); i++ {
			do("tab", chromedp.KeyEvent(kb.Tab))
			reached[eval("focus", `(document.activeElement && document.activeElement.dataset.kb) || ""`)] = true
		}
		for i := 0; i < atoi(n); i++ {
			if !reached[strconv.Itoa(i)] {
				t.Errorf("page %s: control %d of %s is not reached by Tab: %s", name, i, n,
					eval("which", `document.querySelector('[data-kb="`+strconv.Itoa(i)+`"]').outerHTML.slice(0, 200)`))
			}
		}
		do("375 px", chromedp.EmulateViewport(375, 800))
		if w := eval("width", `String(document.documentElement.scrollWidth)`); w != "375" {
			wide := eval("wide elements", `JSON.stringify([...document.querySelectorAll("body *")].filter(e => e.getBoundingClientRect().right > 376).slice(0, 8).map(e => e.tagName + (e.id ? "#" + e.id : "") + "." + e.className + " " + Math.round(e.getBoundingClientRect().right)))`)
			t.Errorf("page %s is %s px wide on a 375 px screen: %s", name, w, wide)
		}
		do("desktop", chromedp.EmulateViewport(1280, 900))
		if shots != "" {
			png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
			if err != nil {
				t.Fatalf("screenshot %s: %v", name, err)
			}
			if err := os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	console := ctl.url + "/console"

	// Signed out: sign-in, then back to the page asked for.
	do("open", chromedp.Navigate(console+"/ssh-keys"), chromedp.WaitVisible(chromedp.CSS("#token")))
	check("sign-in")
	do("token", chromedp.SendKeys(chromedp.CSS("#token"), ctl.token))
	nav("sign in", chromedp.Click(chromedp.CSS("#sign-in")))
	do("back on the page asked for", chromedp.WaitVisible(chromedp.CSS("#sshkey-form")))

	do("an SSH key", chromedp.SendKeys(chromedp.CSS("#sshkey-name"), "laptop"),
		chromedp.SetValue(chromedp.CSS("#sshkey-public_key"), genPubKey(t, "laptop")))
	nav("add it", chromedp.Click(chromedp.CSS("#add-ssh-key")))
	do("listed", chromedp.WaitVisible(chromedp.CSS("table#ssh-keys")))
	if s := text("table#ssh-keys"); !strings.Contains(s, "laptop") || !strings.Contains(s, "SHA256:") {
		t.Fatalf("SSH keys table: %q", s)
	}
	check("ssh-keys")

	do("servers", chromedp.Navigate(console+"/servers"), chromedp.WaitVisible(chromedp.CSS("#create-form")))
	do("a bad name", chromedp.SendKeys(chromedp.CSS("#create-name"), "Not A Name!"),
		chromedp.SendKeys(chromedp.CSS("#create-model"), inst.Model))
	if st := nav("a refused create", chromedp.Click(chromedp.CSS("#create-server"))); st != http.StatusBadRequest {
		t.Fatalf("a refused create: %d", st)
	}
	do("the message", chromedp.WaitVisible(chromedp.CSS("#create-name-err")))
	if s := text("#create-name-err"); s == "" {
		t.Fatal("no message beside the name")
	}
	do("a good name", chromedp.SetValue(chromedp.CSS("#create-name"), "demo"), chromedp.Click(chromedp.CSS(`input[name="ssh_key_ids"]`)))
	nav("create", chromedp.Click(chromedp.CSS("#create-server")))
	do("the server's page", chromedp.WaitVisible(chromedp.CSS("[data-watch]")))
	loc, _ := chromedp.Run(bctx, chromedp.Location())
	serverPath := strings.TrimPrefix(loc, ctl.url)
	serverID := strings.TrimPrefix(serverPath, "/console/servers/")
	if !strings.HasPrefix(serverID, "srv_") {
		t.Fatalf("after create: %s", loc)
	}
	// The page polls the status until the server runs.
	do("running", chromedp.WaitVisible(chromedp.CSS(`[data-watch] .status[data-status="running"]`)))
	do("reload", chromedp.Navigate(loc), chromedp.WaitVisible(chromedp.CSS("#open-playground")))
	if s := text("#deployment-url"); s != "http://"+addr+"/api/v1" {
		t.Fatalf("deployment URL %q", s)
	}
	if s := text("#snippet-python"); !strings.Contains(s, "http://"+addr+"/api/v1") || !strings.Contains(s, inst.Model) {
		t.Fatalf("python snippet %q", s)
	}

	do("a key", chromedp.SendKeys(chromedp.CSS("#key-name"), "app"), chromedp.SendKeys(chromedp.CSS("#key-requests_per_minute"), "600"))
	nav("create the key", chromedp.Click(chromedp.CSS("#create-key")))
	do("its secret", chromedp.WaitVisible(chromedp.CSS("#new-secret")))
	secret := text("#new-secret")
	if !strings.HasPrefix(secret, "hearth_live_") {
		t.Fatalf("secret %q", secret)
	}
	// A request with the key, from an SDK, for the usage chart; sent now
	// so that its minute is sealed and reported by the time the page is
	// read again below.
	until(t, node.url, secret, http.StatusOK, 10*time.Second)
	sdk := openai.NewClient(option.WithBaseURL(node.url), option.WithAPIKey(secret), option.WithMaxRetries(0))
	if _, err := sdk.Chat.Completions.New(context.Background(), userParams(inst.Model, "Say hi", 4)); err != nil {
		t.Fatalf("a request with the key: %v", err)
	}
	do("reload", chromedp.Navigate(loc), chromedp.WaitVisible(chromedp.CSS("#keys")))
	keyID := eval("the key's id", `document.querySelector("#keys tr[data-key]").dataset.key`)
	if eval("secret again", `String(document.getElementById("new-secret") === null && !document.body.textContent.includes(`+jsString(secret)+`))`) != "true" {
		t.Fatal("the secret is shown a second time")
	}

	do("a bad port", chromedp.SendKeys(chromedp.CSS("#rule-port_range"), "99999"))
	if st := nav("a refused rule", chromedp.Click(chromedp.CSS("#add-rule"))); st != http.StatusBadRequest {
		t.Fatalf("a refused rule: %d", st)
	}
	do("the message", chromedp.WaitVisible(chromedp.CSS("#rule-port_range-err")))
	var apiErr struct {
		Error struct{ Message, Param string }
	}
	ctl.api("POST", "/v1/servers/"+serverID+"/firewall-rules", map[string]any{"direction": "inbound", "protocol": "tcp",
		"port_range": "99999", "action": "allow"}, &apiErr)
	if s := text("#rule-port_range-err"); apiErr.Error.Param != "port_range" || !strings.Contains(s, apiErr.Error.Message) {
		t.Fatalf("beside the ports %q, the API says %+v", s, apiErr)
	}
	do("a rule", chromedp.SetValue(chromedp.CSS("#rule-port_range"), "22"), chromedp.SetValue(chromedp.CSS("#rule-source"), "192.0.2.0/24"))
	nav("add the rule", chromedp.Click(chromedp.CSS("#add-rule")))
	do("listed", chromedp.WaitVisible(chromedp.CSS("#rules tr[data-rule]")))
	if s := text("#rules"); !strings.Contains(s, "192.0.2.0/24") || !strings.Contains(s, "22") {
		t.Fatalf("rules %q", s)
	}
	check("server")
	nav("delete the rule", chromedp.Click(chromedp.CSS("#rules button.danger")))
	do("gone", chromedp.WaitVisible(chromedp.CSS("#rule-form")), chromedp.WaitNotPresent(chromedp.CSS("#rules")))
	var rules struct{ Data []any }
	ctl.api("GET", "/v1/servers/"+serverID+"/firewall-rules", nil, &rules)
	if len(rules.Data) != 0 {
		t.Fatalf("rules left: %v", rules.Data)
	}

	// The playground: the browser streams from the deployment API.
	nav("playground", chromedp.Click(chromedp.CSS("#open-playground")))
	do("the key and parameters", chromedp.WaitVisible(chromedp.CSS("#pg-key")),
		chromedp.SetValue(chromedp.CSS("#pg-key"), secret), chromedp.SetValue(chromedp.CSS("#pg-max-tokens"), "12"),
		chromedp.SetValue(chromedp.CSS("#pg-temperature"), "0.5"))
	do("send", chromedp.Click(chromedp.CSS("#pg-send")))
	if cors {
		if _, err := chromedp.Run(bctx, chromedp.Poll[bool](`document.getElementById("pg-status").textContent.startsWith("Done")`,
			chromedp.WithPollingTimeout(60*time.Second))); err != nil {
			t.Fatalf("playground: %v; status %q", err, text("#pg-status"))
		}
		if n := eval("chunks", `document.getElementById("pg-output").getAttribute("data-tokens") || "0"`); n == "0" || n == "1" || text("#pg-output") == "" {
			t.Fatalf("playground streamed %s chunks: %q", n, text("#pg-output"))
		}
		// Stop ends a long answer while it streams: the browser drops the
		// stream, and the page says so.
		do("a long answer", chromedp.SetValue(chromedp.CSS("#pg-max-tokens"), "1500"), chromedp.Click(chromedp.CSS("#pg-send")))
		if _, err := chromedp.Run(bctx, chromedp.Poll[bool](`Number(document.getElementById("pg-output").getAttribute("data-tokens")) >= 3`,
			chromedp.WithPollingTimeout(60*time.Second))); err != nil {
			t.Fatalf("long answer: %v; status %q", err, text("#pg-status"))
		}
		do("stop", chromedp.Click(chromedp.CSS("#pg-stop")))
		if _, err := chromedp.Run(bctx, chromedp.Poll[bool](`document.getElementById("pg-status").textContent.startsWith("Stopped")`,
			chromedp.WithPollingTimeout(10*time.Second))); err != nil {
			t.Fatalf("stop: %v; status %q", err, text("#pg-status"))
		}
		do("short again", chromedp.SetValue(chromedp.CSS("#pg-max-tokens"), "12"))
	} else {
		// Without CORS on the deployment API (a hearthd without
		// --cors-allowed-origins) the browser refuses the answer: the page
		// says why instead of hanging.
		t.Log("hearthd has no --cors-allowed-origins: the playground's streamed answer is not checked, only its refusal")
		if _, err := chromedp.Run(bctx, chromedp.Poll[bool](`document.getElementById("pg-status").textContent.includes("cors-allowed-origins")`,
			chromedp.WithPollingTimeout(60*time.Second))); err != nil {
			t.Fatalf("playground without CORS: %v; status %q", err, text("#pg-status"))
		}
	}
	if s := text("#pg-curl"); !strings.Contains(s, "http://"+addr+"/api/v1/chat/completions") || !strings.Contains(s, `"max_tokens":12`) ||
		!strings.Contains(s, `"temperature":0.5`) || strings.Contains(s, secret) {
		t.Fatalf("curl %q", s)
	}
	check("playground")

	// The server's page charts the usage the node reported and lists
	// every change made above, each done.
	testutil.WaitFor(t, 2*time.Minute, "the request's usage reported, every change done", func() bool {
		var acts struct{ Data []struct{ Status string } }
		ctl.api("GET", "/v1/servers/"+serverID+"/actions", nil, &acts)
		for _, a := range acts.Data {
			if a.Status != "success" {
				return false
			}
		}
		return len(acts.Data) >= 4 && ctl.keyUsage(t, serverID, keyID).Requests >= 1
	})
	do("back", chromedp.Navigate(loc), chromedp.WaitVisible(chromedp.CSS("#keys")))
	do("the charts", chromedp.WaitVisible(chromedp.CSS("#chart-requests svg rect.bar-requests")),
		chromedp.WaitVisible(chromedp.CSS("#chart-tokens svg rect.bar-prompt")))
	if s := text("#usage-summary"); !strings.HasPrefix(s, "Last 24 hours: ") || strings.HasPrefix(s, "Last 24 hours: 0 requests") {
		t.Fatalf("usage summary %q", s)
	}
	if h := eval("the bar's height", `String(Math.round(document.querySelector("#chart-requests svg").getBoundingClientRect().height))`); atoi(h) < 100 {
		t.Fatalf("the requests chart is %s px high", h)
	}
	do("the table", chromedp.Click(chromedp.CSS("details.numbers summary")), chromedp.WaitVisible(chromedp.CSS("#usage-table")))
	if n := eval("rows", `String(document.querySelectorAll("#usage-table tbody tr").length)`); n != "24" {
		t.Fatalf("usage table: %s rows", n)
	}
	actions := eval("actions", `JSON.stringify([...document.querySelectorAll("#actions tr[data-command]")].map(
		r => r.dataset.command + " " + r.querySelector(".status").textContent))`)
	for _, want := range []string{"create success", "api_key_create success", "firewall_rule_add success", "firewall_rule_delete success"} {
		if !strings.Contains(actions, `"`+want+`"`) {
			t.Fatalf("actions %s: no %q", actions, want)
		}
	}
	check("server-usage")
	nav("daily", chromedp.Click(chromedp.CSS("#usage-day")))
	do("the daily chart", chromedp.WaitVisible(chromedp.CSS(`#usage-day[aria-current="true"]`)),
		chromedp.WaitVisible(chromedp.CSS("#chart-requests svg rect.bar-requests")))
	if s := text("#usage-summary"); !strings.HasPrefix(s, "Last 30 days: ") {
		t.Fatalf("daily usage summary %q", s)
	}
	nav("revoke", chromedp.Click(chromedp.CSS("#keys button.danger")))
	do("revoked", chromedp.WaitVisible(chromedp.CSS("#key-form")), chromedp.WaitNotPresent(chromedp.CSS("#keys")))
	var keys struct{ Data []any }
	ctl.api("GET", "/v1/servers/"+serverID+"/api-keys", nil, &keys)
	if len(keys.Data) != 0 {
		t.Fatalf("keys left: %v", keys.Data)
	}

	nav("delete", chromedp.Click(chromedp.CSS("#delete-server")))
	do("the confirmation", chromedp.WaitVisible(chromedp.CSS("#delete-confirm")))
	if s := text("h1"); !strings.Contains(s, "demo") {
		t.Fatalf("confirmation %q does not name the server", s)
	}
	check("delete")
	do("a wrong name", chromedp.SendKeys(chromedp.CSS("#delete-confirm"), "dem"))
	if st := nav("refused", chromedp.Click(chromedp.CSS("#confirm-delete"))); st != http.StatusBadRequest {
		t.Fatalf("a wrong confirmation: %d", st)
	}
	do("the message", chromedp.WaitVisible(chromedp.CSS("#delete-confirm-err")))
	if code := ctl.api("GET", "/v1/servers/"+serverID, nil, nil); code != http.StatusOK {
		t.Fatalf("server after a wrong confirmation: %d", code)
	}
	do("the name", chromedp.SetValue(chromedp.CSS("#delete-confirm"), "demo"))
	nav("confirm", chromedp.Click(chromedp.CSS("#confirm-delete")))
	do("the list", chromedp.WaitVisible(chromedp.CSS("#create-form")))
	if s := text(".flash"); !strings.Contains(s, "demo is being deleted") {
		t.Fatalf("after delete: %q", s)
	}
	check("servers")
	testutil.WaitFor(t, 60*time.Second, "server gone", func() bool {
		return ctl.api("GET", "/v1/servers/"+serverID, nil, nil) == http.StatusNotFound
	})

	do("token", chromedp.Navigate(console+"/token"), chromedp.WaitVisible(chromedp.CSS("#sign-out")))
	check("token")
	nav("sign out", chromedp.Click(chromedp.CSS("#sign-out")))
	do("the sign-in page", chromedp.WaitVisible(chromedp.CSS("#token")))
	do("signed out", chromedp.Navigate(console+"/servers"), chromedp.WaitVisible(chromedp.CSS("#token")))
}

// hearthdHasFlag says whether `hearthd serve` takes --name.
func hearthdHasFlag(t *testing.T, name string) bool {
	t.Helper()
	out, _ := exec.Command(binary(t, "hearthd"), "serve", "--help").CombinedOutput()
	return strings.Contains(string(out), "-"+name+" ")
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
