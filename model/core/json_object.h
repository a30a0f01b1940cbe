#pragma once
// Parsing a settings file's text that must hold one JSON object (config.json, a Quest preset).
#include <nlohmann/json.hpp>
#include <string>

#include "kernels/common/error.h"

namespace quest {

// json_text parsed; InputError "<source>: not valid JSON: ..." or "<source>: expected <expected>" when it is not a
// JSON object.
inline nlohmann::json parse_json_object(const std::string& json_text, const std::string& source, const char* expected) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(json_text);
    } catch (const nlohmann::json::exception& e) {
        throw InputError(source + ": not valid JSON: " + e.what());
    }
    if (!j.is_object()) throw InputError(source + ": expected " + std::string(expected));
    return j;
}

}  // namespace quest
