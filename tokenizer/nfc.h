#pragma once
// Unicode Normalization Form C (UAX #15): canonical decomposition, canonical ordering, canonical composition.
// Tables from tokenizer/nfc_tables.h (generated, see tools/make_nfc_tables.py).
#include <string>
#include <string_view>

namespace quest {

// NFC of `text`, which must be valid UTF-8. Text whose code points are all below U+0300 is returned as it is
// (nothing there decomposes or composes).
std::string to_nfc(std::string_view text);

}  // namespace quest
