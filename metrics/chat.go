package metrics

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Finish reasons, the values of the finish_reason label of
// hearth_generations_total. The first three are the OpenAI finish
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

func latencyHistogram(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:                            name,
		Help:                            help,
		Buckets:                         buckets,
		NativeHistogramBucketFactor:     1.1,
		NativeHistogramMaxBucketNumber:  160,
		NativeHistogramMinResetDuration: time.Hour,
	}, labels)
}

// Token kinds, the values of the kind label of hearth_tokens_total.
// Reasoning tokens are the part of the completion tokens that was
// thinking, as OpenAI's usage counts them: they are in both.
const (
	TokensPrompt     = "prompt"
	TokensCompletion = "completion"
	TokensReasoning  = "reasoning"
)

// routeModel is a generation route (or any API route) and the model it
// served: the labels of most series below. The model is bounded: a
// deployment serves one at a time, and changes it only when its server's
// model is changed.
type routeModel struct{ route, model string }

// finishCounters are one route and model's generation counters, by finish
// reason index and streamed (0, 1).
type finishCounters [numFinish][2]prometheus.Counter

// tokenCounters are one route and model's token counters: prompt,
// completion, reasoning.
type tokenCounters [3]prometheus.Counter

type chatMetrics struct {
	generations *prometheus.CounterVec
	byReason    *childCache[routeModel, *finishCounters]

	ttft       *prometheus.HistogramVec
	ttftBy     *childCache[string, prometheus.Observer]
	interToken *tokenHistogram // once a token: a histogram of its own (tokenhist.go)
	duration   *prometheus.HistogramVec
	durationBy *childCache[routeModel, prometheus.Observer]

	tokens     *prometheus.CounterVec
	tokensBy   *childCache[routeModel, *tokenCounters]
	embeddings *prometheus.CounterVec
	embedBy    *childCache[string, prometheus.Counter]

	activeStreams prometheus.Gauge
}

func newChatMetrics() *chatMetrics {
	m := &chatMetrics{
		generations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_generations_total",
			Help: "Generations ended (each choice of a request is one), by route (chat, responses, completions), model, finish reason and whether they were streamed.",
		}, []string{"route", "model", "finish_reason", "stream"}),
		ttft: latencyHistogram("hearth_time_to_first_token_seconds",
			"Time from accepting a generation's request to its first generated token, by route.", ttftBuckets(), "route"),
		interToken: newTokenHistogram("hearth_inter_token_latency_seconds",
			"Time between consecutive generated tokens of a generation.", interTokenBuckets()),
		duration: latencyHistogram("hearth_request_duration_seconds",
			"Time from receiving a deployment API request to sending its last byte, by route (chat, responses, embeddings, completions, models) and model.",
			durationBuckets(), "route", "model"),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_tokens_total",
			Help: "Tokens processed, as reported by the model runtime, by route, model and kind (prompt, completion, and reasoning: the part of completion that was thinking).",
		}, []string{"route", "model", "kind"}),
		embeddings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_embeddings_total",
			Help: "Inputs embedded (one vector each), by model.",
		}, []string{"model"}),
		activeStreams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hearth_active_streams",
			Help: "Generations currently running.",
		}),
	}
	// Resolving every (reason, stream) pair of a route and model at once
	// makes all of them visible as 0 from its first generation, so rate()
	// and ratios work before the first occurrence of each.
	m.byReason = newChildCache(func(k routeModel) *finishCounters {
		var c finishCounters
		for _, r := range []string{FinishStop, FinishLength, FinishToolCalls, FinishError, FinishCancelled} {
			c[finishIndex(r)][0] = m.generations.WithLabelValues(k.route, k.model, r, "false")
			c[finishIndex(r)][1] = m.generations.WithLabelValues(k.route, k.model, r, "true")
		}
		return &c
	})
	m.ttftBy = newChildCache(func(route string) prometheus.Observer { return m.ttft.WithLabelValues(route) })
	m.durationBy = newChildCache(func(k routeModel) prometheus.Observer { return m.duration.WithLabelValues(k.route, k.model) })
	m.tokensBy = newChildCache(func(k routeModel) *tokenCounters {
		return &tokenCounters{m.tokens.WithLabelValues(k.route, k.model, TokensPrompt),
			m.tokens.WithLabelValues(k.route, k.model, TokensCompletion),
			m.tokens.WithLabelValues(k.route, k.model, TokensReasoning)}
	})
	m.embedBy = newChildCache(func(model string) prometheus.Counter { return m.embeddings.WithLabelValues(model) })
	return m
}

func (m *chatMetrics) register(reg prometheus.Registerer) {
	reg.MustRegister(m.generations, m.ttft, m.interToken, m.duration,
		m.tokens, m.embeddings, m.activeStreams)
}

// generationRoute folds a route that generates into the three that do
// (chat, responses, completions), bounding the label; anything else is
// RouteOther.
func generationRoute(route string) string {
	switch route {
	case RouteChatCompletions, RouteResponses, RouteCompletions:
		return route
	}
	return RouteOther
}

// apiRoute folds a route into the API's five (chat, responses,
// embeddings, completions, models), or RouteOther.
func apiRoute(route string) string {
	switch route {
	case RouteChatCompletions, RouteResponses, RouteCompletions, RouteEmbeddings, RouteModels:
		return route
	}
	return RouteOther
}

// Generation counts one ended generation of route (RouteChatCompletions,
// RouteResponses or RouteCompletions) on model. finishReason is one of
// the Finish constants (others are counted as FinishOther).
func (n *Node) Generation(route, model, finishReason string, stream bool) {
	k := routeModel{generationRoute(route), model}
	s := 0
	if stream {
		s = 1
	}
	if i := finishIndex(finishReason); i >= 0 {
		n.chat.byReason.get(k)[i][s].Inc()
		return
	}
	n.chat.generations.WithLabelValues(k.route, k.model, FinishOther, strconv.FormatBool(stream)).Inc()
}

// ObserveTTFT records the time from accepting a generation's request (of
// route) to its first token.
func (n *Node) ObserveTTFT(route string, d time.Duration) {
	n.chat.ttftBy.get(generationRoute(route)).Observe(d.Seconds())
}

// ObserveInterToken records the gap between two consecutive tokens.
func (n *Node) ObserveInterToken(d time.Duration) { n.chat.interToken.Observe(d.Seconds()) }

// ObserveRequest records a deployment API request's time from its receipt
// to its last byte, by route and the model it was served by. Routes other
// than the API's five (health checks, unknown paths) are not observed.
func (n *Node) ObserveRequest(route, model string, d time.Duration) {
	if route = apiRoute(route); route == RouteOther {
		return
	}
	n.chat.durationBy.get(routeModel{route, model}).Observe(d.Seconds())
}

// Tokens adds a request's token counts on route and model: prompt,
// completion, and the part of completion that was reasoning. Negative
// counts are ignored.
func (n *Node) Tokens(route, model string, prompt, completion, reasoning int) {
	c := n.chat.tokensBy.get(routeModel{apiRoute(route), model})
	for i, v := range [3]int{prompt, completion, reasoning} {
		if v > 0 {
			c[i].Add(float64(v))
		}
	}
}

// Embedded counts inputs embedded (vectors made) by model.
func (n *Node) Embedded(model string, inputs int) {
	if inputs > 0 {
		n.chat.embedBy.get(model).Add(float64(inputs))
	}
}

// StreamStarted and StreamEnded bracket a generation for
// hearth_active_streams; call StreamEnded exactly once per StreamStarted.
func (n *Node) StreamStarted() { n.chat.activeStreams.Inc() }

// StreamEnded: see StreamStarted.
func (n *Node) StreamEnded() { n.chat.activeStreams.Dec() }
