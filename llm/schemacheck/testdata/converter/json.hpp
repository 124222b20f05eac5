// json-schema-to-grammar.h of Ollama 0.9.6 includes nlohmann json as "json.hpp".
#pragma once
#include <nlohmann/json.hpp>
