package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// floorRelayEnv makes the test binary one of the floor's Go relays, as
// `hearth-bench relay` is: the mode in the variable, the addresses last.
const floorRelayEnv = "HEARTH_BENCH_TEST_RELAY"

func TestMain(m *testing.M) {
	if mode := os.Getenv(floorRelayEnv); mode != "" {
		st, err := RunGoRelay(mode, os.Args[len(os.Args)-2], os.Args[len(os.Args)-1])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		_ = json.NewEncoder(os.Stdout).Encode(st)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func testGoRelay(mode string) FloorRelay {
	return FloorRelay{Name: mode, Cmd: []string{os.Args[0]}, Env: []string{floorRelayEnv + "=" + mode, "GOMAXPROCS=1"}}
}

// Every relay of the floor carries every byte, reports its CPU, and the
// result holds a median per relay and a ratio to C for the Go ones.
func TestFloorRelaysEveryByte(t *testing.T) {
	ctx := context.Background()
	c, err := BuildCRelay(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err) // make test's dependencies install gcc
	}
	const chunks = 300
	r, err := RunFloor(ctx, FloorOptions{
		Relays: []FloorRelay{CRelay(c), testGoRelay(RelayEvloop), testGoRelay(RelayGoroutine)},
		Chunks: chunks, Gap: 200 * time.Microsecond, Rounds: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Rounds) != 2 {
		t.Fatalf("%d rounds, want 2", len(r.Rounds))
	}
	for i, runs := range r.Rounds {
		if len(runs) != 3 {
			t.Fatalf("round %d: %d runs, want 3", i, len(runs))
		}
		// The order rotates: round 2 starts with the second relay.
		if want := r.Order[i%3]; runs[0].Relay != want {
			t.Errorf("round %d starts with %s, want %s", i, runs[0].Relay, want)
		}
		for _, run := range runs {
			st := run.Stat
			if st.Bytes != chunks*int64(len(floorChunk)) {
				t.Errorf("%s: %d bytes, want %d", run.Relay, st.Bytes, chunks*len(floorChunk))
			}
			if st.Reads < 1 || st.Reads > chunks {
				t.Errorf("%s: %d reads for %d chunks", run.Relay, st.Reads, chunks)
			}
			if st.UserUS+st.SysUS <= 0 || st.WallUS <= 0 || run.CPUusPerChunk <= 0 {
				t.Errorf("%s: no CPU or time reported: %+v", run.Relay, st)
			}
		}
	}
	for _, name := range []string{RelayC, RelayEvloop, RelayGoroutine} {
		if r.Median[name] <= 0 {
			t.Errorf("no median for %s: %v", name, r.Median)
		}
	}
	if len(r.Ratio) != 2 || r.Ratio[RelayEvloop] <= 0 || r.Ratio[RelayGoroutine] <= 0 {
		t.Errorf("ratios %v, want the two Go relays'", r.Ratio)
	}
	md := r.Markdown()
	for _, want := range []string{"Relay floor", "C, one epoll loop", "hearthd's event loop", "Go's netpoller", "1.00×"} {
		if !strings.Contains(md, want) {
			t.Errorf("Markdown lacks %q:\n%s", want, md)
		}
	}
}

// A relay that does not relay fails the floor rather than giving a number.
func TestFloorRejectsARelayThatDropsBytes(t *testing.T) {
	for name, script := range map[string]string{
		"never connects":    `echo '{"reads":1,"bytes":1,"user_us":1,"sys_us":1,"wall_us":1}'`,
		"claims every byte": fmt.Sprintf(`echo '{"reads":10,"bytes":%d,"user_us":1,"sys_us":1,"wall_us":1}'`, 10*len(floorChunk)),
		"fails":             `exit 3`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := RunFloor(context.Background(), FloorOptions{
				Relays: []FloorRelay{{Name: RelayC, Cmd: []string{"/bin/sh", "-c", script}}},
				Chunks: 10, Gap: time.Millisecond, Rounds: 1,
			})
			if err == nil {
				t.Fatal("a relay that relayed nothing passed")
			}
		})
	}
}

func TestRunGoRelayRejectsAnUnknownMode(t *testing.T) {
	if _, err := RunFloor(context.Background(), FloorOptions{
		Relays: []FloorRelay{testGoRelay("splice")}, Chunks: 5, Gap: time.Millisecond, Rounds: 1,
	}); err == nil || !strings.Contains(err.Error(), "unknown relay") {
		t.Fatalf("err %v, want the unknown relay named", err)
	}
}

// The report sets the real runtime's ratio beside the floor's, and says
// nothing of it when either is missing.
func TestReportSetsTheFloorBesideTheRealRuntime(t *testing.T) {
	r := &Report{
		Floor: &FloorResult{Chunks: 10, Median: map[string]float64{RelayC: 30, RelayEvloop: 40}, Ratio: map[string]float64{RelayEvloop: 40.0 / 30}},
		Real:  &RealResult{NginxCPUusPerToken: 36, HearthdCPUusPerToken: 45},
	}
	md := r.Markdown()
	if want := "hearthd spends 1.25× nginx's CPU per token (+9.0 µs); relaying bytes alone, hearthd's event loop spends 1.33× the C relay's (+10.0 µs a chunk)"; !strings.Contains(md, want) {
		t.Errorf("report lacks %q:\n%s", want, md)
	}
	r.Real.NginxCPUusPerToken = 0 // nginx did not run
	if md := r.Markdown(); strings.Contains(md, "Against the floor") {
		t.Errorf("a comparison without nginx:\n%s", md)
	}
}
