package tinymodel

import (
	"bytes"
	"crypto/sha256"
	"os"
	"path/filepath"
	"testing"

	"github.com/ollama/ollama/fs/ggml"
)

func TestDeterministicFromSeed(t *testing.T) {
	sum := func(opts Options) [32]byte {
		var b bytes.Buffer
		if err := Write(&b, opts); err != nil {
			t.Fatal(err)
		}
		return sha256.Sum256(b.Bytes())
	}
	if sum(Options{Seed: 1}) != sum(Options{Seed: 1}) {
		t.Fatal("same seed, different files")
	}
	if sum(Options{Seed: 1}) == sum(Options{Seed: 2}) {
		t.Fatal("different seeds, same file")
	}
}

func TestFileDecodesAsLlama(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := WriteFile(path, Options{}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	if st.Size() > 1<<20 {
		t.Fatalf("model is %d bytes; it should stay tiny", st.Size())
	}
	g, err := ggml.Decode(f, -1)
	if err != nil {
		t.Fatal(err)
	}
	kv := g.KV()
	tokens := kv.Strings("tokenizer.ggml.tokens")
	if kv.Architecture() != "llama" || kv.Uint("embedding_length") != 64 || kv.Uint("block_count") != 2 ||
		kv.Uint("vocab_size") != uint32(len(tokens)) || kv.Uint("rope.dimension_count") != 16 {
		t.Fatalf("kv: %v", kv)
	}
	// Scalars are uint32 as llama.cpp expects; arrays have one entry
	// per token.
	for _, k := range []string{"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id", "general.file_type", "llama.context_length"} {
		if _, ok := kv[k].(uint32); !ok {
			t.Errorf("%s is %T, want uint32", k, kv[k])
		}
	}
	if n := len(kv.Ints("tokenizer.ggml.token_type")); n != len(tokens) {
		t.Errorf("%d token types for %d tokens", n, len(tokens))
	}
	if n := len(kv.Floats("tokenizer.ggml.scores")); n != len(tokens) {
		t.Errorf("%d scores for %d tokens", n, len(tokens))
	}
	seen := map[string]bool{}
	for _, tok := range tokens {
		if seen[tok] {
			t.Fatalf("duplicate token %q", tok)
		}
		seen[tok] = true
	}
	if tokens[UnknownID] != "<unk>" || tokens[BOSID] != "<s>" || tokens[EOSID] != "</s>" || tokens[firstByte] != "<0x00>" || tokens[firstWord-1] != "<0xFF>" || len(tokens) != firstWord+400 {
		t.Fatalf("vocabulary layout: %q ... (%d)", tokens[:5], len(tokens))
	}

	shapes := map[string][]uint64{}
	for _, tn := range g.Tensors().Items() {
		if tn.Kind != 0 {
			t.Errorf("%s kind %d, want F32", tn.Name, tn.Kind)
		}
		shapes[tn.Name] = tn.Shape
	}
	v := uint64(len(tokens))
	want := map[string][]uint64{
		"token_embd.weight":        {64, v},
		"output.weight":            {64, v},
		"output_norm.weight":       {64},
		"blk.1.attn_q.weight":      {64, 64},
		"blk.1.ffn_gate.weight":    {64, 128},
		"blk.1.ffn_down.weight":    {128, 64},
		"blk.0.attn_norm.weight":   {64},
		"blk.0.attn_output.weight": {64, 64},
	}
	for name, s := range want {
		if got := shapes[name]; len(got) != len(s) || got[0] != s[0] || got[len(got)-1] != s[len(s)-1] {
			t.Errorf("%s shape %v, want %v", name, got, s)
		}
	}
	if len(shapes) != 3+2*9 {
		t.Errorf("%d tensors, want %d", len(shapes), 3+2*9)
	}
}

func TestWordsDistinct(t *testing.T) {
	w := words(2000)
	if len(w) != 2000 {
		t.Fatalf("%d words", len(w))
	}
	seen := map[string]bool{}
	for _, x := range w {
		if seen[x] {
			t.Fatalf("duplicate %q", x)
		}
		seen[x] = true
	}
}
