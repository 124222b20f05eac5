package main

import "testing"

func TestMaxStreamsFitsOpenFileLimit(t *testing.T) {
	for _, c := range []struct {
		n      int
		noFile uint64
		want   int
	}{
		{10000, 1 << 17, 10000},
		{10000, 0, 10000}, // unknown limit: as asked
		{10000, 20000, 9800},
		{10000, 500, 50},
		{10000, 100, 1},
	} {
		if got := maxStreams(c.n, c.noFile); got != c.want {
			t.Errorf("maxStreams(%d, %d) = %d, want %d", c.n, c.noFile, got, c.want)
		}
	}
	for _, sc := range scenarios(1, "c10000", 20000) {
		if sc.Concurrency != 9800 || 2*sc.Concurrency+400 > 20000 {
			t.Fatalf("c10000 under a 20000 limit: %d streams", sc.Concurrency)
		}
	}
	if got := scenarios(1, "c1,max-c16", 20000); len(got) != 2 {
		t.Fatalf("selected %d scenarios, want 2", len(got))
	}
}

func TestReq2000FollowsC1000(t *testing.T) {
	all := scenarios(1, "", 1<<17)
	for i, sc := range all {
		if sc.Name != "c1000" {
			continue
		}
		if i+1 >= len(all) {
			t.Fatal("nothing after c1000")
		}
		r := all[i+1]
		if r.Name != "req2000" || r.Tokens != 1 || r.Rate != 2000 || r.Concurrency != 1000 {
			t.Fatalf("after c1000: %+v, want req2000, 1 token at 2000 req/s", r)
		}
		return
	}
	t.Fatal("no c1000 scenario")
}

func TestParseVariants(t *testing.T) {
	got, err := parseVariants("pebble, postgres,postgres-3")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Variant() != "pebble" || got[1].Variant() != "postgres" || got[2].Variant() != "postgres ×3" {
		t.Fatalf("variants %+v", got)
	}
	for _, bad := range []string{"", "mysql", "postgres-0", "postgres-x", "pebble-2"} {
		if _, err := parseVariants(bad); err == nil {
			t.Errorf("parseVariants(%q) accepted", bad)
		}
	}
}
