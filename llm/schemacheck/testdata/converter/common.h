// The three helpers of llama.cpp's common.h that json-schema-to-grammar.cpp
// uses, so that it builds alone (converter_test.go).
#pragma once
#include <sstream>
#include <string>
#include <vector>

static std::string string_join(const std::vector<std::string> & values, const std::string & separator) {
    std::ostringstream r;
    for (size_t i = 0; i < values.size(); ++i) {
        if (i > 0) r << separator;
        r << values[i];
    }
    return r.str();
}

static std::vector<std::string> string_split(const std::string & str, const std::string & delimiter) {
    std::vector<std::string> parts;
    size_t start = 0, end = str.find(delimiter);
    while (end != std::string::npos) {
        parts.push_back(str.substr(start, end - start));
        start = end + delimiter.length();
        end = str.find(delimiter, start);
    }
    parts.push_back(str.substr(start));
    return parts;
}

static std::string string_repeat(const std::string & str, size_t n) {
    std::string r;
    for (size_t i = 0; i < n; i++) r += str;
    return r;
}
