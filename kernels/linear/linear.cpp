// The registry of the weight formats: one line per format (kernels/linear/format_<name>.cpp).
#include "kernels/linear/linear.h"

#include <stdexcept>

namespace quest {

extern const LinearFormatOps kF16Format;   // format_f16.cpp
extern const LinearFormatOps kInt4Format;  // format_int4.cpp

namespace {
const LinearFormatOps* const kRegistry[] = {&kF16Format, &kInt4Format};
}  // namespace

const LinearFormatOps& linear_format(LinearFormat f) {
    for (const LinearFormatOps* ops : kRegistry)
        if (ops->tag == f) return *ops;
    throw std::logic_error(std::string("linear_format: no format registered for '") + linear_format_name(f) + "'");
}

HostLinear convert_host_linear(HostLinear h, const LinearStorage& to) {
    if (h.storage == to) return h;
    const int64_t rows = h.rows, cols = h.cols;
    return linear_format(to.format).from_f32(linear_format(h.storage.format).to_f32(h), rows, cols, to);
}

}  // namespace quest
