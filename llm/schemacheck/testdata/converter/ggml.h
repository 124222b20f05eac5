// What json-schema-to-grammar.h of Ollama 0.9.6 wants of ggml.h.
#pragma once
#include <cassert>
#define GGML_ASSERT(x) assert(x)
