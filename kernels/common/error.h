#pragma once
// Errors the engine reports to its user. Every message names the file or field at fault and what was expected,
// so that the command line can print it as one line and exit non-zero.
#include <stdexcept>
#include <string>

namespace quest {

// Bad input: a malformed model file, an invalid config field, a wrong command-line value.
struct InputError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A request the engine cannot serve with the resources at hand (context too long for memory, ...).
struct ResourceError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The user interrupted a long operation (Ctrl-C during a prefill); the state is as it was before the operation.
struct Interrupted : std::runtime_error {
    using std::runtime_error::runtime_error;
};

}  // namespace quest
