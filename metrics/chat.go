package metrics

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Finish reasons, the values of the finish_reason label of
// hearth_chat_completions_total. The first three are the OpenAI finish
// reasons; error and cancelled mark generations that did not finish.
const (
	FinishStop      = "stop"
	FinishLength    = "length"
	FinishToolCalls = "tool_calls"
	FinishError     = "error"
	FinishCancelled = "cancelled"
	// FinishOther counts any reason not listed above.
	FinishOther = "other"
)

// numFinish is the number of finish reasons with pre-resolved children.
const numFinish = 5

// finishIndex returns the index of a pre-resolved finish reason, or -1.
func finishIndex(reason string) int {
	switch reason {
	case FinishStop:
		return 0
	case FinishLength:
		return 1
	case FinishToolCalls:
		return 2
	case FinishError:
		return 3
	case FinishCancelled:
		return 4
	}
	return -1
}

// Bucket layouts for LLM serving. Classic buckets keep every Prometheus
// version and PromQL function working; native buckets (factor 1.1, about
// 7% relative error) are exposed as well for servers that negotiate them.

// ttftBuckets: a warm small model answers in milliseconds, a long prompt on
// CPU can take tens of seconds, a cold load up to a minute.
func ttftBuckets() []float64 {
	return []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 20, 30, 60}
}

// interTokenBuckets: 100 µs for tiny models on fast hardware up to seconds
// when a generation stalls.
func interTokenBuckets() []float64 {
	return []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}
}

// durationBuckets: end to end, long completions run for minutes.
func durationBuckets() []float64 {
	return []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600}
}

func latencyHistogram(name, help string, buckets []float64) prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:                            name,
		Help:                            help,
		Buckets:                         buckets,
		NativeHistogramBucketFactor:     1.1,
		NativeHistogramMaxBucketNumber:  160,
		NativeHistogramMinResetDuration: time.Hour,
	})
}

type chatMetrics struct {
	completions *prometheus.CounterVec
	// byReason[finishIndex(r)][stream] are the pre-resolved children.
	byReason [numFinish][2]prometheus.Counter

	ttft       prometheus.Histogram
	interToken *tokenHistogram // once a token: a histogram of its own (tokenhist.go)
	duration   prometheus.Histogram

	promptTokens     prometheus.Counter
	completionTokens prometheus.Counter
	activeStreams    prometheus.Gauge
}

func newChatMetrics() *chatMetrics {
	m := &chatMetrics{
		completions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_chat_completions_total",
			Help: "Chat completions ended, by finish reason and whether they were streamed.",
		}, []string{"finish_reason", "stream"}),
		ttft: latencyHistogram("hearth_time_to_first_token_seconds",
			"Time from accepting a chat completion to its first generated token.", ttftBuckets()),
		interToken: newTokenHistogram("hearth_inter_token_latency_seconds",
			"Time between consecutive generated tokens of a chat completion.", interTokenBuckets()),
		duration: latencyHistogram("hearth_chat_completion_duration_seconds",
			"Time from accepting a chat completion to sending its last byte.", durationBuckets()),
		promptTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hearth_prompt_tokens_total",
			Help: "Prompt tokens processed, as reported by the model runtime.",
		}),
		completionTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hearth_completion_tokens_total",
			Help: "Completion tokens generated, as reported by the model runtime.",
		}),
		activeStreams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hearth_active_streams",
			Help: "Chat completions currently generating.",
		}),
	}
	// Resolving every (reason, stream) pair up front makes all of them
	// visible as 0 from the first scrape, so rate() and ratios work
	// before the first occurrence.
	for _, r := range []string{FinishStop, FinishLength, FinishToolCalls, FinishError, FinishCancelled} {
		m.byReason[finishIndex(r)][0] = m.completions.WithLabelValues(r, "false")
		m.byReason[finishIndex(r)][1] = m.completions.WithLabelValues(r, "true")
	}
	return m
}

func (m *chatMetrics) register(reg prometheus.Registerer) {
	reg.MustRegister(m.completions, m.ttft, m.interToken, m.duration,
		m.promptTokens, m.completionTokens, m.activeStreams)
}

// ChatCompletion counts one ended chat completion. finishReason is one of
// the Finish constants (others are counted as FinishOther).
func (n *Node) ChatCompletion(finishReason string, stream bool) {
	s := 0
	if stream {
		s = 1
	}
	if i := finishIndex(finishReason); i >= 0 {
		n.chat.byReason[i][s].Inc()
		return
	}
	n.chat.completions.WithLabelValues(FinishOther, strconv.FormatBool(stream)).Inc()
}

// ObserveTTFT records the time from accepting a chat completion to its
// first token.
func (n *Node) ObserveTTFT(d time.Duration) { n.chat.ttft.Observe(d.Seconds()) }

// ObserveInterToken records the gap between two consecutive tokens.
func (n *Node) ObserveInterToken(d time.Duration) { n.chat.interToken.Observe(d.Seconds()) }

// ObserveChatDuration records a chat completion's end-to-end time.
func (n *Node) ObserveChatDuration(d time.Duration) { n.chat.duration.Observe(d.Seconds()) }

// Tokens adds a completion's token counts. Negative counts are ignored.
func (n *Node) Tokens(prompt, completion int) {
	if prompt > 0 {
		n.chat.promptTokens.Add(float64(prompt))
	}
	if completion > 0 {
		n.chat.completionTokens.Add(float64(completion))
	}
}

// StreamStarted and StreamEnded bracket a generation for
// hearth_active_streams; call StreamEnded exactly once per StreamStarted.
func (n *Node) StreamStarted() { n.chat.activeStreams.Inc() }

// StreamEnded: see StreamStarted.
func (n *Node) StreamEnded() { n.chat.activeStreams.Dec() }
