package fake

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hearthd/hearth/llm"
)

func drain(t *testing.T, s llm.Stream) (string, llm.Event, error) {
	t.Helper()
	var b strings.Builder
	var last llm.Event
	for {
		ev, err := s.Recv()
		if err == io.EOF {
			return b.String(), last, nil
		}
		if err != nil {
			return b.String(), last, err
		}
		b.WriteString(ev.Content)
		last = ev
	}
}

func TestDefaultStream(t *testing.T) {
	r := New(Config{})
	s, err := r.Chat(context.Background(), &llm.Request{Messages: []llm.Message{{Role: "user", Content: "hi there you"}}})
	if err != nil {
		t.Fatal(err)
	}
	text, last, err := drain(t, s)
	if err != nil {
		t.Fatal(err)
	}
	if text != "Hello world" || !last.Done || last.FinishReason != llm.FinishStop || last.PromptTokens != 3 || last.CompletionTokens != 2 {
		t.Fatalf("got %q %+v", text, last)
	}
	if !r.LastStream().Finished() {
		t.Fatal("stream not recorded as finished")
	}
	if c, _ := r.LastStream().Cancelled(); c {
		t.Fatal("finished stream recorded as cancelled")
	}
}

func TestMaxTokensAndStop(t *testing.T) {
	r := New(Config{Tokens: []string{"a", "b", "c"}, TokenCount: 10})
	n := 4
	s, _ := r.Chat(context.Background(), &llm.Request{Options: llm.Options{MaxTokens: &n}})
	text, last, err := drain(t, s)
	if err != nil || text != "abca" || last.FinishReason != llm.FinishLength || last.CompletionTokens != 4 {
		t.Fatalf("max tokens: %q %+v %v", text, last, err)
	}
	s, _ = r.Chat(context.Background(), &llm.Request{Options: llm.Options{Stop: []string{"c"}}})
	text, last, err = drain(t, s)
	if err != nil || text != "ab" || last.FinishReason != llm.FinishStop || last.CompletionTokens != 2 {
		t.Fatalf("stop: %q %+v %v", text, last, err)
	}
}

func TestRecordsRequestCopy(t *testing.T) {
	r := New(Config{})
	temp := 0.5
	req := &llm.Request{
		Messages: []llm.Message{{Role: "user", Content: "x"}},
		Options:  llm.Options{Temperature: &temp},
		Tools:    []llm.Tool{{Name: "f", Parameters: json.RawMessage(`{"type":"object"}`)}},
	}
	s, _ := r.Chat(context.Background(), req)
	s.Close()
	temp = 2
	req.Messages[0].Content = "changed"
	got := r.LastRequest()
	if *got.Options.Temperature != 0.5 || got.Messages[0].Content != "x" || got.Options.TopP != nil || got.Tools[0].Name != "f" {
		t.Fatalf("recorded request %+v", got)
	}
	if r.Calls() != 1 {
		t.Fatalf("calls = %d", r.Calls())
	}
}

func TestToolCalls(t *testing.T) {
	calls := []llm.ToolCall{{ID: "call_1", Name: "get_weather", Arguments: json.RawMessage(`{"city":"Oslo"}`)}}
	r := New(Config{Tokens: []string{"x"}, ToolCalls: calls})
	s, _ := r.Chat(context.Background(), &llm.Request{})
	var got []llm.ToolCall
	var last llm.Event
	for {
		ev, err := s.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev.ToolCalls...)
		last = ev
	}
	if len(got) != 1 || got[0].Name != "get_weather" || string(got[0].Arguments) != `{"city":"Oslo"}` || last.FinishReason != llm.FinishToolCalls {
		t.Fatalf("tool calls %+v, last %+v", got, last)
	}
}

func TestFailures(t *testing.T) {
	unavailable := errors.Join(errors.New("down"), llm.ErrUnavailable)
	r := New(Config{ChatErr: unavailable})
	if _, err := r.Chat(context.Background(), &llm.Request{}); !errors.Is(err, llm.ErrUnavailable) {
		t.Fatalf("chat err = %v", err)
	}
	boom := errors.New("boom")
	r.SetConfig(Config{Tokens: []string{"a", "b", "c"}, StreamErr: boom, FailAfter: 2})
	s, err := r.Chat(context.Background(), &llm.Request{})
	if err != nil {
		t.Fatal(err)
	}
	text, _, err := drain(t, s)
	if text != "ab" || !errors.Is(err, boom) {
		t.Fatalf("mid-stream: %q %v", text, err)
	}
	if _, err := s.Recv(); !errors.Is(err, boom) {
		t.Fatalf("Recv after failure = %v", err)
	}
	r.SetConfig(Config{ReadyErr: unavailable})
	if err := r.Ready(context.Background()); !errors.Is(err, llm.ErrUnavailable) {
		t.Fatalf("ready = %v", err)
	}
}

func TestCancelWithoutReading(t *testing.T) {
	r := New(Config{TokenCount: 1000, TokenDelay: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	s, err := r.Chat(ctx, &llm.Request{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	info := r.LastStream()
	before := time.Now()
	cancel()
	select {
	case <-info.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("cancellation not recorded")
	}
	c, at := info.Cancelled()
	if !c || at.Before(before) {
		t.Fatalf("cancelled = %v at %v", c, at)
	}
	if _, err := s.Recv(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Recv after cancel = %v", err)
	}
}

func TestCloseStopsBlockedRecv(t *testing.T) {
	r := New(Config{TokenCount: 1000, FirstTokenDelay: time.Hour})
	s, _ := r.Chat(context.Background(), &llm.Request{})
	errc := make(chan error, 1)
	go func() { _, err := s.Recv(); errc <- err }()
	s.Close()
	s.Close() // twice is fine
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("Recv after Close returned no error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Recv still blocked after Close")
	}
	info := r.LastStream()
	if c, _ := info.Cancelled(); !c || !info.Closed() || info.Finished() {
		t.Fatalf("cancelled=%v closed=%v finished=%v", c, info.Closed(), info.Finished())
	}
}

func TestChatDelayHonoursContext(t *testing.T) {
	r := New(Config{ChatDelay: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := r.Chat(ctx, &llm.Request{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
}

// Hold stops every stream after its first token until it is closed; a
// cancelled stream stops waiting.
func TestHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hold := make(chan struct{})
		r := New(Config{Tokens: []string{"a", "b"}, Hold: hold})
		held, _ := r.Chat(context.Background(), &llm.Request{})
		defer held.Close()
		if ev, err := held.Recv(); err != nil || ev.Content != "a" {
			t.Fatalf("first token %+v %v", ev, err)
		}
		next := make(chan llm.Event, 1)
		go func() { ev, _ := held.Recv(); next <- ev }()
		synctest.Wait()
		select {
		case ev := <-next:
			t.Fatalf("second token %+v before the hold was released", ev)
		default:
		}
		ctx, cancel := context.WithCancel(context.Background())
		other, _ := r.Chat(ctx, &llm.Request{})
		defer other.Close()
		other.Recv()
		cancel()
		if _, err := other.Recv(); !errors.Is(err, context.Canceled) {
			t.Fatalf("a cancelled held stream: %v", err)
		}
		close(hold)
		if ev := <-next; ev.Content != "b" {
			t.Fatalf("after the release %+v", ev)
		}
	})
}
