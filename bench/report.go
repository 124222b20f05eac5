package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// Machine describes where a report was measured.
type Machine struct {
	NProc  int    `json:"nproc"`
	CPU    string `json:"cpu"`
	Kernel string `json:"kernel"`
	Go     string `json:"go"`
	// KernelMonitor names the kernel's memory monitors that were on
	// (kernelMonitor): their periodic work stalls a core.
	KernelMonitor string `json:"kernel_monitor,omitempty"`
}

// ThisMachine reads the machine description from /proc.
func ThisMachine() Machine {
	m := Machine{NProc: runtime.NumCPU(), Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	m.KernelMonitor = kernelMonitor(damonRoot)
	return m
}

// Report is one benchmark run.
type Report struct {
	Started   time.Time        `json:"started"`
	Machine   Machine          `json:"machine"`
	Command   string           `json:"command"`
	Scenarios []ScenarioResult `json:"scenarios"`
	// MaxThroughput names the scenario with the most relayed tokens/s.
	MaxThroughput string           `json:"max_throughput_scenario,omitempty"`
	ColdStart     *ColdStartResult `json:"cold_start,omitempty"`
	Real          *RealResult      `json:"real_runtime,omitempty"`
	Notes         []string         `json:"notes,omitempty"`
}

func MiB(b int64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }

func us(v float64) string {
	switch {
	case v >= 10000 || v <= -10000:
		return fmt.Sprintf("%.1f ms", v/1000)
	default:
		return fmt.Sprintf("%.0f µs", v)
	}
}

// writeRunHeader writes when and where a run was measured, and how.
func WriteRunHeader(b *strings.Builder, started time.Time, m Machine, command string) {
	if !started.IsZero() {
		fmt.Fprintf(b, "Run %s on %d × %s, Linux %s, %s.\n\n", started.UTC().Format(time.RFC3339),
			m.NProc, m.CPU, m.Kernel, m.Go)
		if m.KernelMonitor != "" {
			fmt.Fprintf(b, "Kernel memory monitor on: %s.\n\n", m.KernelMonitor)
		}
	}
	if command != "" {
		fmt.Fprintf(b, "Command: `%s`\n\n", command)
	}
}

// Markdown renders the report's tables: over TLS (the production path)
// first, then over plain HTTP.
func (r *Report) Markdown() string {
	var b strings.Builder
	WriteRunHeader(&b, r.Started, r.Machine, r.Command)
	for _, tr := range []struct{ name, title string }{
		{"tls", "Over TLS (the production path): clients reach hearthd and nginx over HTTPS, the same certificate"},
		{"http", "Over plain HTTP (loopback, or behind a TLS-terminating proxy)"},
	} {
		var scs []ScenarioResult
		for _, s := range r.Scenarios {
			if s.Transport == tr.name || s.Transport == "" && tr.name == "http" {
				scs = append(scs, s)
			}
		}
		if len(scs) == 0 {
			continue
		}
		fmt.Fprintf(&b, "### %s\n\n", tr.title)
		scenarioTable(&b, scs)
		nginxTable(&b, scs)
	}
	if c := r.ColdStart; c != nil {
		b.WriteString(c.Markdown("mock runtime"))
	}
	if rr := r.Real; rr != nil {
		b.WriteString(rr.Markdown())
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	return b.String()
}

// scenarioTable writes each scenario's sides: the runtime directly and
// through hearthd.
func scenarioTable(b *strings.Builder, scs []ScenarioResult) {
	b.WriteString("| scenario | load | TTFT p50 direct / through | TTFT p99 direct / through | added TTFT p50 / p99 | inter-token p99 direct / through | completions/s direct / through | tokens/s direct / through | hearthd CPU-s per 1M tokens | hearthd RSS peak / HWM MiB | errors direct / through | CPU-µs/token hearthd / mock / loadgen |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range scs {
		sc := s.Scenario
		load := fmt.Sprintf("closed %d streams", sc.Concurrency)
		if sc.Rate > 0 {
			load = fmt.Sprintf("open %.0f req/s", sc.Rate)
		}
		pace := "unlimited"
		if sc.Mock.TPS > 0 {
			pace = fmt.Sprintf("%.0f tok/s", sc.Mock.TPS)
		}
		load += fmt.Sprintf(", %d tok @ %s, TTFT %s, %s", sc.Tokens, pace, sc.Mock.TTFT, sc.Duration.Round(time.Millisecond))
		mock := "n/a"
		if s.Through.MockCPUS > 0 && s.Through.Tokens > 0 {
			mock = fmt.Sprintf("%.1f", s.Through.MockCPUS/float64(s.Through.Tokens)*1e6)
		}
		lg := 0.0
		if s.Through.Tokens > 0 {
			lg = s.Through.LoadgenCPUS / float64(s.Through.Tokens) * 1e6
		}
		fmt.Fprintf(b, "| %s | %s | %s / %s | %s / %s | %s / %s | %s / %s | %.0f / %.0f | %.0f / %.0f | %.2f | %s / %s | %d / %d | %.1f / %s / %.1f |\n",
			sc.Name, load,
			us(s.Direct.TTFT.P50), us(s.Through.TTFT.P50),
			us(s.Direct.TTFT.P99), us(s.Through.TTFT.P99),
			us(s.AddedTTFTP50us), us(s.AddedTTFTP99us),
			us(s.Direct.Gap.P99), us(s.Through.Gap.P99),
			s.Direct.CompletionsPS, s.Through.CompletionsPS,
			s.Direct.TokensPS, s.Through.TokensPS,
			s.HearthdCPUSPerMTokens,
			MiB(s.Through.ProxyRSSPeak), MiB(s.Through.ProxyHWM),
			s.Direct.Errors, s.Through.Errors,
			s.HearthdCPUusPerToken, mock, lg)
	}
	b.WriteString("\n")
}

// Write stores the report as JSON and Markdown in dir, named by its start
// time, and as latest.json / latest.md.
func (r *Report) Write(dir string) (string, error) {
	return WriteResults(dir, "", r.Started, r, r.Markdown())
}

// writeResults stores v as JSON and md in dir as <prefix><time>.json|md and
// <prefix>latest.json|md, and returns the path of the Markdown file.
func WriteResults(dir, prefix string, started time.Time, v any, md string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create %s: %w", dir, err)
	}
	js, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return "", fmt.Errorf("encode report: %w", err)
	}
	stamp := prefix + started.UTC().Format("20060102T150405Z")
	for name, data := range map[string][]byte{
		stamp + ".json": js, stamp + ".md": []byte(md), prefix + "latest.json": js, prefix + "latest.md": []byte(md),
	} {
		if err := writeFile(filepath.Join(dir, name), bytes.TrimRight(data, "\n")); err != nil {
			return "", err
		}
	}
	return filepath.Join(dir, stamp+".md"), nil
}

// ratio is a / b, or 0 when b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// nginxTable writes the scenarios that ran through nginx too, side by side
// with hearthd: what one tuned hop costs, and hearthd's cost as a ratio.
func nginxTable(b *strings.Builder, scs []ScenarioResult) {
	header := false
	for _, s := range scs {
		n := s.Nginx
		if n == nil {
			continue
		}
		if !header {
			b.WriteString("Against nginx (`proxy_buffering off`, keep-alive upstream, one worker as hearthd has one processor) in front of the same mock, same run:\n\n")
			b.WriteString("| scenario | completions/s direct / nginx / hearthd (hearthd ÷ nginx) | added TTFT p50 nginx / hearthd | added TTFT p99 nginx / hearthd | proxy CPU-µs/token nginx / hearthd (ratio) | proxy RSS peak MiB nginx / hearthd (ratio) | errors nginx / hearthd | proxy CPU-µs/token user, sys nginx / hearthd | hearthd mallocs/request |\n")
			b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
			header = true
		}
		t, d := s.Through, s.Direct
		fmt.Fprintf(b, "| %s | %.0f / %.0f / %.0f (**%.2f×**) | %s / %s | %s / %s | %.1f / %.1f (**%.2f×**) | %s / %s (%.2f×) | %d / %d | %s | %s |\n",
			s.Scenario.Name, d.CompletionsPS, n.CompletionsPS, t.CompletionsPS, ratio(t.CompletionsPS, n.CompletionsPS),
			us(n.TTFT.P50-d.TTFT.P50), us(t.TTFT.P50-d.TTFT.P50),
			us(n.TTFT.P99-d.TTFT.P99), us(t.TTFT.P99-d.TTFT.P99),
			n.CPUusPerToken(), t.CPUusPerToken(), ratio(t.CPUusPerToken(), n.CPUusPerToken()),
			MiB(n.ProxyRSSPeak), MiB(t.ProxyRSSPeak), ratio(float64(t.ProxyRSSPeak), float64(n.ProxyRSSPeak)),
			n.Errors, t.Errors,
			cpuSplit(*n, t), mallocs(s.HearthdMallocsPerRequest))
	}
	if header {
		b.WriteString("\n")
	}
}

// cpuSplit is the proxies' CPU per token as user and system time, nginx's
// then hearthd's, or n/a for results recorded before the split was.
func cpuSplit(n, t Side) string {
	if n.ProxyUserS+n.ProxySysS+t.ProxyUserS+t.ProxySysS == 0 {
		return "n/a"
	}
	nu, ns := n.CPUSplitusPerToken()
	tu, ts := t.CPUSplitusPerToken()
	return fmt.Sprintf("user %.1f / %.1f, sys %.1f / %.1f", nu, tu, ns, ts)
}

// mallocs is hearthd's allocations per request, or n/a if not measured.
func mallocs(perRequest float64) string {
	if perRequest <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.0f", perRequest)
}
