// Converts JSON schemas as Ollama does (llama.cpp's json_schema_to_grammar):
// one compact schema a line on stdin, one JSON object a line on stdout,
// {"grammar": …} or {"error": …} (converter_test.go).
#include "json-schema-to-grammar.h"
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

int main() {
    std::string line;
    while (std::getline(std::cin, line)) {
        nlohmann::json out;
        try {
            out["grammar"] = json_schema_to_grammar(nlohmann::ordered_json::parse(line));
        } catch (const std::exception & e) {
            out["error"] = e.what();
        }
        std::cout << out.dump() << "\n";
    }
}
