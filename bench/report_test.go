package bench

import (
	"strings"
	"testing"
)

func TestNginxTableCPUSplitAndMallocs(t *testing.T) {
	scs := []ScenarioResult{{
		Scenario:                 Scenario{Name: "req2000"},
		Nginx:                    &Side{Tokens: 1000, ProxyCPUS: 0.035, ProxyUserS: 0.0091, ProxySysS: 0.0259},
		Through:                  Side{Tokens: 1000, ProxyCPUS: 0.040, ProxyUserS: 0.0203, ProxySysS: 0.0197},
		HearthdMallocsPerRequest: 412.4,
	}, {
		// Recorded before the split and the allocation count existed.
		Scenario: Scenario{Name: "old"},
		Nginx:    &Side{Tokens: 1000, ProxyCPUS: 0.035},
		Through:  Side{Tokens: 1000, ProxyCPUS: 0.040},
	}}
	var b strings.Builder
	nginxTable(&b, scs)
	md := b.String()
	for _, want := range []string{
		"| proxy CPU-µs/token user, sys nginx / hearthd | hearthd mallocs/request |\n|---|---|---|---|---|---|---|---|---|\n",
		"| 0 / 0 | user 9.1 / 20.3, sys 25.9 / 19.7 | 412 |\n",
		"| 0 / 0 | n/a | n/a |\n",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("table lacks %q:\n%s", want, md)
		}
	}
}
