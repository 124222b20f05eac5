// Command hearth-tinymodel writes the tiny test model (a llama GGUF with
// random weights) used by the runtime tests and local development, and
// optionally the Ollama chat template and parameters hearthd creates it with.
package main

import (
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/hearthd/hearth/llm/tinymodel"
)

func main() {
	out := flag.String("o", "", "output path of the GGUF file (required)")
	seed := flag.Uint64("seed", 0, "weight seed; the same seed writes the same file")
	tmpl := flag.String("template", "", "also write the model's Ollama chat template to this file")
	pooling := flag.Uint("pooling", 0, "llama.pooling_type (1 mean, 2 CLS, 3 last): write an embedding model instead")
	params := flag.Bool("print-params", false, "print the model's parameters as --model-param flags for hearthd serve")
	flag.Parse()
	if *out == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: hearth-tinymodel -o path [-seed N] [-pooling N] [-template path] [-print-params]")
		os.Exit(2)
	}
	if err := tinymodel.WriteFile(*out, tinymodel.Options{Seed: *seed, Pooling: uint32(*pooling)}); err != nil {
		fmt.Fprintln(os.Stderr, "hearth-tinymodel:", err)
		os.Exit(1)
	}
	if *tmpl != "" {
		if err := os.WriteFile(*tmpl, []byte(tinymodel.Template), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "hearth-tinymodel:", err)
			os.Exit(1)
		}
	}
	if *params {
		var flags []string
		for k, v := range tinymodel.Parameters() {
			flags = append(flags, fmt.Sprintf("--model-param %s=%v", k, v))
		}
		sort.Strings(flags)
		fmt.Println(strings.Join(flags, " "))
	}
}
