#pragma once
// Reading an enum back from its name: the one loop behind the *_from_name functions of the enums whose names come
// from a *_name function.
#include <string_view>

namespace quest {

// Sets out to the first of `values` whose name_of(value) equals `name`; false (out untouched) when none does.
template <class Values, class NameOf, class E>
bool value_from_name(std::string_view name, const Values& values, NameOf name_of, E& out) {
    for (const E v : values)
        if (name == name_of(v)) {
            out = v;
            return true;
        }
    return false;
}

}  // namespace quest
