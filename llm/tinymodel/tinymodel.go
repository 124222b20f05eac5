// Package tinymodel writes a tiny llama-architecture GGUF model with random
// weights. It loads in a fraction of a second and generates gibberish fast on
// a CPU, which is all the runtime tests and local development need from a
// model: real tokens streamed by a real runtime.
//
// The weights are shaped so that generations are stable and long: the output
// layer pushes the control tokens (including end-of-sequence) and the raw byte
// tokens far down, so the model emits only whole words and almost always runs
// until max_tokens or a stop sequence ends it.
package tinymodel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"strconv"

	"github.com/ollama/ollama/fs/ggml"
)

// Template is an Ollama chat template for the tiny model. It renders every
// message, including tools and tool calls, so chat requests with tools are
// accepted by the runtime.
const Template = `{{- if .System }}<|system|>{{ .System }}
{{ end }}{{- if .Tools }}<|tools|>{{ range .Tools }}{{ . }}
{{ end }}{{ end }}{{- range .Messages }}<|{{ .Role }}|>{{ .Content }}
{{- if .ToolCalls }}{{ range .ToolCalls }}<tool_call>{"name": "{{ .Function.Name }}", "arguments": {{ .Function.Arguments }}}</tool_call>{{ end }}{{ end }}
{{ end }}<|assistant|>`

// Parameters returns the Ollama model parameters to create the tiny model
// with. The model never ends a generation by itself, so num_predict bounds
// requests that set no max_tokens (they finish with "length"). One thread
// is several times faster than more for a model this small, and keeps a
// shared test machine responsive.
func Parameters() map[string]any {
	return map[string]any{"num_predict": 256, "num_thread": 1}
}

// Options shape the model. Zero fields take the defaults below.
type Options struct {
	Seed          uint64 // weight seed; same seed, same file
	Embedding     int    // embedding length (default 64)
	Layers        int    // block count (default 2)
	FeedForward   int    // feed-forward length (default 128)
	Heads         int    // attention heads (default 4)
	ContextLength int    // trained context length (default 2048)
	Words         int    // word tokens in the vocabulary (default 400)
	// Pooling, if set, is llama.pooling_type (1 mean, 2 CLS, 3 last): the
	// model is then an embedding model, which Ollama lists with the
	// "embedding" capability only and refuses to chat or generate with.
	Pooling uint32
}

func (o Options) withDefaults() Options {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.Embedding, 64)
	def(&o.Layers, 2)
	def(&o.FeedForward, 128)
	def(&o.Heads, 4)
	def(&o.ContextLength, 2048)
	def(&o.Words, 400)
	return o
}

// Token ids of the control tokens.
const (
	UnknownID = 0
	BOSID     = 1
	EOSID     = 2
	firstByte = 3
	firstWord = firstByte + 256
)

// Token types as GGUF (llama.cpp) numbers them.
const (
	typeNormal  = 1
	typeUnknown = 2
	typeControl = 3
	typeByte    = 6
)

// Write writes the model to w.
func Write(w io.Writer, opts Options) error {
	// ggml.WriteGGUF writes tensors at offsets in parallel, so it needs a
	// real file; stream that file to w afterwards.
	f, err := os.CreateTemp("", "tinymodel-*.gguf")
	if err != nil {
		return fmt.Errorf("tinymodel: temp file: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := write(f, opts); err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("tinymodel: rewind: %w", err)
	}
	if _, err := io.Copy(w, f); err != nil {
		return fmt.Errorf("tinymodel: copy: %w", err)
	}
	return nil
}

// WriteFile writes the model to path, replacing any file there.
func WriteFile(path string, opts Options) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("tinymodel: %w", err)
	}
	if err := write(f, opts); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("tinymodel: sync %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("tinymodel: close %s: %w", path, err)
	}
	return nil
}

// Vocabulary returns the model's tokens in id order.
func Vocabulary(opts Options) []string {
	opts = opts.withDefaults()
	toks := make([]string, 0, firstWord+opts.Words)
	toks = append(toks, "<unk>", "<s>", "</s>")
	for b := 0; b < 256; b++ {
		toks = append(toks, fmt.Sprintf("<0x%02X>", b))
	}
	return append(toks, words(opts.Words)...)
}

// metadata is the GGUF header of a llama model with opts' shape (opts has
// its defaults) and the vocabulary tokens.
func metadata(opts Options, tokens []string) ggml.KV {
	vocab := len(tokens)
	scores := make([]float32, vocab)
	types := make([]int32, vocab)
	types[UnknownID] = typeUnknown
	types[BOSID], types[EOSID] = typeControl, typeControl
	for i := firstByte; i < firstWord; i++ {
		types[i] = typeByte
	}
	for i := firstWord; i < vocab; i++ {
		types[i] = typeNormal
		// SentencePiece scores rank merges; longer words win.
		scores[i] = -float32(i - firstWord)
	}

	e, ff := opts.Embedding, opts.FeedForward
	return ggml.KV{
		"general.architecture":                   "llama",
		"general.name":                           "hearth-tiny",
		"general.file_type":                      uint32(0),
		"llama.context_length":                   uint32(opts.ContextLength),
		"llama.embedding_length":                 uint32(e),
		"llama.block_count":                      uint32(opts.Layers),
		"llama.feed_forward_length":              uint32(ff),
		"llama.attention.head_count":             uint32(opts.Heads),
		"llama.attention.head_count_kv":          uint32(opts.Heads),
		"llama.rope.dimension_count":             uint32(e / opts.Heads),
		"llama.attention.layer_norm_rms_epsilon": float32(1e-5),
		"llama.vocab_size":                       uint32(vocab),
		"tokenizer.ggml.model":                   "llama",
		"tokenizer.ggml.tokens":                  tokens,
		"tokenizer.ggml.scores":                  scores,
		"tokenizer.ggml.token_type":              types,
		"tokenizer.ggml.bos_token_id":            uint32(BOSID),
		"tokenizer.ggml.eos_token_id":            uint32(EOSID),
		"tokenizer.ggml.unknown_token_id":        uint32(UnknownID),
		"tokenizer.ggml.add_bos_token":           true,
		"tokenizer.ggml.add_eos_token":           false,
	}
}

func write(f *os.File, opts Options) error {
	opts = opts.withDefaults()
	if opts.Embedding%opts.Heads != 0 {
		return errors.New("tinymodel: embedding length must be a multiple of the head count")
	}
	tokens := Vocabulary(opts)
	kv := metadata(opts, tokens)
	if opts.Pooling > 0 {
		kv["llama.pooling_type"] = opts.Pooling
	}
	e, ff, vocab := opts.Embedding, opts.FeedForward, len(tokens)

	rng := rand.New(rand.NewPCG(opts.Seed, 0x68656172746821)) // "hearth!"
	normal := func(n int, scale float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * scale)
		}
		return v
	}
	ones := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = 1
		}
		return v
	}

	// Every embedding carries a large constant in dimension 0. The
	// residual stream stays dominated by it, so after the final RMS norm
	// dimension 0 is about sqrt(embedding) for every position: a constant
	// input the output layer uses as a per-token bias.
	embd := normal(e*vocab, 0.02)
	for t := 0; t < vocab; t++ {
		embd[t*e] = 1
	}
	out := normal(e*vocab, 0.5)
	for t := 0; t < vocab; t++ {
		out[t*e] = 0
		if t < firstWord {
			// Control and byte tokens: logit about -8*4 = -32 below
			// the words, so they are practically never sampled. An
			// explicit stop sequence or max_tokens ends generations.
			out[t*e] = -4
		}
	}

	tensors := []*ggml.Tensor{
		tensor("token_embd.weight", embd, e, vocab),
		tensor("output_norm.weight", ones(e), e),
		tensor("output.weight", out, e, vocab),
	}
	for l := 0; l < opts.Layers; l++ {
		p := "blk." + strconv.Itoa(l) + "."
		tensors = append(tensors,
			tensor(p+"attn_norm.weight", ones(e), e),
			tensor(p+"attn_q.weight", normal(e*e, 0.02), e, e),
			tensor(p+"attn_k.weight", normal(e*e, 0.02), e, e),
			tensor(p+"attn_v.weight", normal(e*e, 0.02), e, e),
			tensor(p+"attn_output.weight", normal(e*e, 0.02), e, e),
			tensor(p+"ffn_norm.weight", ones(e), e),
			tensor(p+"ffn_gate.weight", normal(e*ff, 0.02), e, ff),
			tensor(p+"ffn_up.weight", normal(e*ff, 0.02), e, ff),
			tensor(p+"ffn_down.weight", normal(ff*e, 0.02), ff, e),
		)
	}
	if err := ggml.WriteGGUF(f, kv, tensors); err != nil {
		return fmt.Errorf("tinymodel: write gguf: %w", err)
	}
	return nil
}

// tensor makes an F32 tensor; shape is in GGUF order (ne0 first).
func tensor(name string, data []float32, shape ...int) *ggml.Tensor {
	s := make([]uint64, len(shape))
	n := 1
	for i, d := range shape {
		s[i] = uint64(d)
		n *= d
	}
	if n != len(data) {
		panic(fmt.Sprintf("tinymodel: tensor %s: %d values for shape %v", name, len(data), shape))
	}
	return &ggml.Tensor{Name: name, Kind: 0, Shape: s, WriterTo: f32s(data)}
}

type f32s []float32

func (d f32s) WriteTo(w io.Writer) (int64, error) {
	buf := make([]byte, 4*len(d))
	for i, v := range d {
		binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(v))
	}
	n, err := w.Write(buf)
	return int64(n), err
}

// words returns n distinct SentencePiece word tokens ("▁" marks a leading
// space): common English words first, then made-up syllable words.
func words(n int) []string {
	out := make([]string, 0, n)
	seen := make(map[string]bool, n)
	add := func(w string) {
		if len(out) < n && !seen[w] {
			seen[w] = true
			out = append(out, "▁"+w)
		}
	}
	for _, w := range common {
		add(w)
	}
	cons := []string{"b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z"}
	vow := []string{"a", "e", "i", "o", "u"}
	for len(out) < n {
		before := len(out)
		for _, c1 := range cons {
			for _, v1 := range vow {
				for _, c2 := range cons {
					for _, v2 := range vow {
						add(c1 + v1 + c2 + v2)
					}
				}
			}
		}
		if len(out) == before {
			break // cannot happen for sane n; avoids looping forever
		}
	}
	return out
}

var common = []string{
	"the", "of", "and", "to", "in", "is", "it", "that", "was", "for",
	"on", "are", "with", "as", "at", "be", "this", "have", "from", "or",
	"one", "had", "by", "word", "but", "not", "what", "all", "were", "we",
	"when", "your", "can", "said", "there", "use", "an", "each", "which", "she",
	"do", "how", "their", "if", "will", "up", "other", "about", "out", "many",
	"then", "them", "these", "so", "some", "her", "would", "make", "like", "him",
	"into", "time", "has", "look", "two", "more", "write", "go", "see", "number",
	"no", "way", "could", "people", "my", "than", "first", "water", "been", "call",
	"who", "oil", "its", "now", "find", "long", "down", "day", "did", "get",
	"come", "made", "may", "part", "hearth", "fire", "warm", "stone", "bread", "river",
	"hello", "world", "light", "small", "model", "token", "quiet", "green", "north", "south",
}
