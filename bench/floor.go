package bench

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hearthd/hearth/internal/evloop"
)

// The relay floor: what relaying a stream's chunks costs with nothing
// around it (no HTTP, no JSON), in C with nginx's structure and in Go with
// hearthd's, measured in the same run as the scenarios. At c=1 each chunk
// wakes the relay from idle, so the ratio of the Go relays to the C one is
// the part of hearthd's CPU per token over nginx's that comes from the
// language's runtime rather than from hearthd's own work (BENCHMARKS.md,
// issue 15).

//go:embed crelay/relay.c
var cRelaySource []byte

// Relay kinds of the floor.
const (
	RelayC         = "c"         // bench/crelay/relay.c: one epoll loop, as nginx's worker
	RelayEvloop    = "evloop"    // internal/evloop, hearthd's relay loop: raw epoll inside Go's netpoller
	RelayGoroutine = "goroutine" // a goroutine reading a net.Conn: Go's netpoller alone
)

// RelayStat is what a relay process reports of its run: the source's reads
// that brought bytes, the bytes relayed, and its CPU time from its start
// (both sockets connected) to the source's close.
type RelayStat struct {
	Reads  int64   `json:"reads"`
	Bytes  int64   `json:"bytes"`
	UserUS float64 `json:"user_us"`
	SysUS  float64 `json:"sys_us"`
	WallUS float64 `json:"wall_us"`
}

// FloorRelay is a relay to measure: Cmd is run with the source's and the
// destination's addresses (host:port) appended, and prints its RelayStat as
// JSON on stdout.
type FloorRelay struct {
	Name string
	Cmd  []string
	Env  []string // added to the environment
}

// FloorOptions configure the floor: Rounds rounds (the relays' order
// rotating, so drift hits each alike) of Chunks chunks, one every Gap.
type FloorOptions struct {
	Relays []FloorRelay
	Chunks int
	Gap    time.Duration
	Rounds int
}

// FloorRun is one relay's run.
type FloorRun struct {
	Relay string    `json:"relay"`
	Stat  RelayStat `json:"stat"`
	// CPUusPerChunk is the relay's CPU time over the chunks sent.
	CPUusPerChunk float64 `json:"cpu_us_per_chunk"`
}

// FloorResult is the floor of a run.
type FloorResult struct {
	Chunks     int           `json:"chunks"`
	ChunkBytes int           `json:"chunk_bytes"`
	Gap        time.Duration `json:"gap_ns"`
	Rounds     [][]FloorRun  `json:"rounds"`
	// Median CPU-µs per chunk over the rounds, by relay, and each Go
	// relay's ÷ C.
	Median map[string]float64 `json:"median_cpu_us_per_chunk"`
	Ratio  map[string]float64 `json:"ratio_to_c,omitempty"`
	Order  []string           `json:"order"`
}

// floorChunk is what every chunk carries: a token's line of Ollama's
// /api/chat stream, the bytes a relay in front of it reads per token.
const floorChunk = `{"model":"hearth-tiny","created_at":"2026-12-01T19:00:00.123456789Z","message":{"role":"assistant","content":" token"},"done":false}` + "\n"

// BuildCRelay compiles the C relay into dir with the system's C compiler
// (gcc, which make test's dependencies install) and returns its path.
func BuildCRelay(ctx context.Context, dir string) (string, error) {
	src := filepath.Join(dir, "relay.c")
	bin := filepath.Join(dir, "crelay")
	if err := os.WriteFile(src, cRelaySource, 0o644); err != nil {
		return "", fmt.Errorf("write relay.c: %w", err)
	}
	if out, err := exec.CommandContext(ctx, "cc", "-O2", "-o", bin, src).CombinedOutput(); err != nil {
		return "", fmt.Errorf("cc relay.c: %w: %s", err, out)
	}
	return bin, nil
}

// RunFloor measures every relay of o, Rounds times.
func RunFloor(ctx context.Context, o FloorOptions) (*FloorResult, error) {
	if len(o.Relays) == 0 || o.Chunks <= 0 || o.Rounds <= 0 {
		return nil, errors.New("floor: relays, chunks and rounds are required")
	}
	r := &FloorResult{Chunks: o.Chunks, ChunkBytes: len(floorChunk), Gap: o.Gap,
		Median: map[string]float64{}, Ratio: map[string]float64{}}
	for _, rl := range o.Relays {
		r.Order = append(r.Order, rl.Name)
	}
	per := map[string][]float64{}
	for round := range o.Rounds {
		var runs []FloorRun
		for i := range o.Relays {
			rl := o.Relays[(i+round)%len(o.Relays)]
			st, err := runRelay(ctx, rl, o.Chunks, o.Gap)
			if err != nil {
				return nil, fmt.Errorf("floor: %s relay, round %d: %w", rl.Name, round+1, err)
			}
			run := FloorRun{Relay: rl.Name, Stat: st, CPUusPerChunk: (st.UserUS + st.SysUS) / float64(o.Chunks)}
			runs = append(runs, run)
			per[rl.Name] = append(per[rl.Name], run.CPUusPerChunk)
		}
		r.Rounds = append(r.Rounds, runs)
	}
	for name, v := range per {
		r.Median[name] = median(v)
	}
	if c := r.Median[RelayC]; c > 0 {
		for name, v := range r.Median {
			if name != RelayC {
				r.Ratio[name] = v / c
			}
		}
	}
	return r, nil
}

// runRelay runs one relay between a paced source and a sink, both on
// loopback in this process, and checks that every byte came through.
func runRelay(ctx context.Context, rl FloorRelay, chunks int, gap time.Duration) (RelayStat, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(chunks)*gap+30*time.Second)
	defer cancel()
	var lc net.ListenConfig
	srcL, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return RelayStat{}, err
	}
	defer srcL.Close()
	dstL, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return RelayStat{}, err
	}
	defer dstL.Close()

	sent := make(chan error, 1)
	go func() { sent <- paceChunks(ctx, srcL, chunks, gap) }()
	got := make(chan int64, 1)
	go func() { got <- sinkBytes(ctx, dstL) }()

	args := append(slices.Clone(rl.Cmd[1:]), srcL.Addr().String(), dstL.Addr().String())
	cmd := exec.CommandContext(ctx, rl.Cmd[0], args...)
	cmd.Env = append(os.Environ(), rl.Env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	runErr := cmd.Run()
	// Unblock the source and the sink if the relay never connected.
	srcL.Close()
	dstL.Close()
	if runErr != nil {
		return RelayStat{}, fmt.Errorf("%v: %w: %s", rl.Cmd, runErr, strings.TrimSpace(stderr.String()))
	}
	if err := <-sent; err != nil {
		return RelayStat{}, fmt.Errorf("source: %w", err)
	}
	sunk := <-got
	var st RelayStat
	if err := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &st); err != nil {
		return RelayStat{}, fmt.Errorf("relay's report %q: %w", stdout.String(), err)
	}
	want := int64(chunks * len(floorChunk))
	if st.Bytes != want || sunk != want {
		return st, fmt.Errorf("relayed %d bytes, the sink got %d, want %d", st.Bytes, sunk, want)
	}
	return st, nil
}

// paceChunks accepts one connection on l and writes chunks to it, chunk i
// at start + i×gap (never early), then closes it.
func paceChunks(ctx context.Context, l net.Listener, chunks int, gap time.Duration) error {
	c, err := l.Accept()
	if err != nil {
		return err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	line := []byte(floorChunk)
	start := time.Now()
	for i := range chunks {
		if d := time.Until(start.Add(time.Duration(i) * gap)); d > 0 {
			time.Sleep(d)
		}
		if _, err := c.Write(line); err != nil {
			return err
		}
	}
	return nil
}

// sinkBytes accepts one connection on l and counts what it reads to its end.
func sinkBytes(ctx context.Context, l net.Listener) int64 {
	c, err := l.Accept()
	if err != nil {
		return 0
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	n, _ := io.Copy(io.Discard, c)
	return n
}

// RunGoRelay is the floor's Go relay of kind mode (RelayEvloop or
// RelayGoroutine) from src to dst: what `hearth-bench relay` runs.
func RunGoRelay(mode, src, dst string) (RelayStat, error) {
	s, err := net.Dial("tcp", src)
	if err != nil {
		return RelayStat{}, err
	}
	defer s.Close()
	d, err := net.Dial("tcp", dst)
	if err != nil {
		return RelayStat{}, err
	}
	defer d.Close()
	var st RelayStat
	var r0 unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &r0); err != nil {
		return st, err
	}
	start := time.Now()
	switch mode {
	case RelayGoroutine:
		err = relayGoroutine(s, d, &st)
	case RelayEvloop:
		err = relayEvloop(s, d, &st)
	default:
		err = fmt.Errorf("unknown relay %q (want %s or %s)", mode, RelayEvloop, RelayGoroutine)
	}
	if err != nil {
		return st, err
	}
	st.WallUS = float64(time.Since(start).Microseconds())
	var r1 unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &r1); err != nil {
		return st, err
	}
	st.UserUS = float64(r1.Utime.Nano()-r0.Utime.Nano()) / 1e3
	st.SysUS = float64(r1.Stime.Nano()-r0.Stime.Nano()) / 1e3
	return st, nil
}

func relayGoroutine(s, d net.Conn, st *RelayStat) error {
	buf := make([]byte, 4096)
	for {
		n, err := s.Read(buf)
		if n > 0 {
			st.Reads++
			st.Bytes += int64(n)
			if _, werr := d.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// relayEvloop relays as hearthd's polled streams do (deployapi/pollrelay.go):
// the source detached from Go's netpoller into an event loop, read in
// polled mode by the loop's goroutine until a read comes up short, and
// written with a raw write to the destination, which stays in the
// netpoller as a client's socket does.
func relayEvloop(s, d net.Conn, st *RelayStat) error {
	l, err := evloop.New(nil)
	if err != nil {
		return err
	}
	defer l.Close()
	dfd, ok := evloop.SocketFD(d)
	if !ok {
		return fmt.Errorf("%T is not a socket", d)
	}
	c, err := l.Detach(s)
	if err != nil {
		return err
	}
	defer c.Close()
	done := make(chan error, 1)
	buf := make([]byte, 4096)
	finished := false
	h := func() {
		for !finished {
			n, err := c.Read(buf)
			if n > 0 {
				st.Reads++
				st.Bytes += int64(n)
				if err := writeRaw(dfd, d, buf[:n]); err != nil {
					finished = true
					done <- err
					return
				}
				if n < len(buf) && !c.HungUp() {
					return // emptied: the loop calls again when more comes
				}
				continue
			}
			if errors.Is(err, evloop.ErrWouldBlock) {
				return
			}
			finished = true
			if err == io.EOF {
				err = nil
			}
			done <- err
			return
		}
	}
	c.Poll(h)
	// Bytes that came before Poll raised their event already.
	l.Post(h)
	return <-done
}

// writeRaw writes p to fd with raw writes, as the loop's relay does; a
// socket without room (never at the floor's pace) takes the rest through
// the netpoller.
func writeRaw(fd int, c net.Conn, p []byte) error {
	for len(p) > 0 {
		n, err := evloop.Write(fd, p)
		switch {
		case n > 0:
			p = p[n:]
		case err == unix.EINTR:
		case err == unix.EAGAIN:
			_, err := c.Write(p)
			return err
		default:
			return err
		}
	}
	return nil
}

// CRelay is the floor's C relay built at bin (BuildCRelay).
func CRelay(bin string) FloorRelay { return FloorRelay{Name: RelayC, Cmd: []string{bin}} }

// Markdown renders the floor.
func (r *FloorResult) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Relay floor (bytes from one socket to another, no HTTP and no JSON: %d chunks of %d bytes, one every %s, one stream; %d rounds, the order rotating):\n\n",
		r.Chunks, r.ChunkBytes, r.Gap, len(r.Rounds))
	b.WriteString("| relay | CPU-µs per chunk, median | each round (user + sys) | ÷ C |\n|---|---|---|---|\n")
	names := map[string]string{
		RelayC:         "C, one epoll loop (nginx's structure)",
		RelayEvloop:    "Go, hearthd's event loop (`internal/evloop`)",
		RelayGoroutine: "Go, a goroutine on Go's netpoller",
	}
	for _, name := range r.Order {
		var rounds []string
		for _, runs := range r.Rounds {
			for _, run := range runs {
				if run.Relay == name {
					n := float64(r.Chunks)
					rounds = append(rounds, fmt.Sprintf("%.1f + %.1f", run.Stat.UserUS/n, run.Stat.SysUS/n))
				}
			}
		}
		ratio := "1.00×"
		if name != RelayC {
			ratio = "n/a"
			if v, ok := r.Ratio[name]; ok {
				ratio = fmt.Sprintf("**%.2f×**", v)
			}
		}
		label := names[name]
		if label == "" {
			label = name
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", label, strconv.FormatFloat(r.Median[name], 'f', 1, 64), strings.Join(rounds, ", "), ratio)
	}
	b.WriteString("\n")
	return b.String()
}
