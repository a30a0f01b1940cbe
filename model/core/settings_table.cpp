#include "model/core/settings_table.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "kernels/common/error.h"
#include "model/core/memory.h"

namespace quest {

namespace {
std::string number_text(double v) {
    if (v == std::floor(v) && std::fabs(v) < 9e15) return std::to_string(static_cast<long long>(v));
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}
std::string names(const std::vector<const char*>& choices) {
    std::string s;
    for (size_t i = 0; i < choices.size(); ++i) s += (i ? ", " : "") + std::string(choices[i]);
    return s;
}
}  // namespace

std::string setting_expectation(SettingKind kind, const std::vector<const char*>& choices, double min, double max) {
    switch (kind) {
    case SettingKind::Int: return "an integer between " + number_text(min) + " and " + number_text(max);
    case SettingKind::Double: return "a number in [" + number_text(min) + ", " + number_text(max) + "]";
    case SettingKind::Bool: return "true or false";
    case SettingKind::Enum: return "one of " + names(choices);
    case SettingKind::Bytes: return "a byte size such as 24GiB or 512MiB";
    }
    return "";
}

std::string format_setting_value(SettingKind kind, const std::vector<const char*>& choices, double value) {
    switch (kind) {
    case SettingKind::Int:
    case SettingKind::Bytes: return std::to_string(static_cast<long long>(value));
    case SettingKind::Double: {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%g", value);
        return buf;
    }
    case SettingKind::Bool: return value != 0 ? "true" : "false";
    case SettingKind::Enum: {
        const size_t i = static_cast<size_t>(value);
        return i < choices.size() ? choices[i] : "?";
    }
    }
    return "";
}

std::string parse_setting_text(SettingKind kind, const std::vector<const char*>& choices, double min, double max,
                               const std::string& text, double& out) {
    auto bad = [&] { return "expected " + setting_expectation(kind, choices, min, max) + ", got '" + text + "'"; };
    switch (kind) {
    case SettingKind::Int: {
        long long v = 0;
        const char* end = text.data() + text.size();
        const auto [p, ec] = std::from_chars(text.data(), end, v);
        if (ec != std::errc() || p != end || text.empty() || double(v) < min || double(v) > max) return bad();
        out = static_cast<double>(v);
        return "";
    }
    case SettingKind::Double: {
        if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return bad();
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (end != text.c_str() + text.size() || !std::isfinite(v) || v < min || v > max) return bad();
        out = v;
        return "";
    }
    case SettingKind::Bool:
        if (text == "true" || text == "on" || text == "1") out = 1;
        else if (text == "false" || text == "off" || text == "0") out = 0;
        else return bad();
        return "";
    case SettingKind::Enum:
        for (size_t i = 0; i < choices.size(); ++i)
            if (text == choices[i]) {
                out = static_cast<double>(i);
                return "";
            }
        return bad();
    case SettingKind::Bytes:
        try {
            out = static_cast<double>(parse_byte_size(text, ""));
        } catch (const InputError& e) {
            const std::string m = e.what();
            return m.rfind(": ", 0) == 0 ? m.substr(2) : m;  // parse_byte_size's own words, without its "what: "
        }
        return "";
    }
    return bad();
}

}  // namespace quest
