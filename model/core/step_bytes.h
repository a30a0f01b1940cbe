#pragma once
#include <utility>

#include "kernels/select/page_codes.h"
#include "model/core/config.h"
#include "model/core/quest_settings.h"

namespace quest {

// The bytes-matched budget of the settings: off unless match_bytes with a selector that takes it (quest and
// two-level count their page bounds in q.metadata's format, sparq its key sketch: sparq::budget). Both backends
// and the bytes model below select its page count (codes::step_pages).
codes::MatchedBudget settings_match(const ModelConfig& c, const QuestSettings& q);

// The bytes model (selection_bytes) of the quest, streaming and oracle selectors without running them (quest bench's
// CUDA rows; equal to what the CPU backend counts for them, tested): what one decode step over `len` tokens reads in
// every layer (the dense layers' KV; in a Quest layer the metadata of the complete pages in q.metadata's format
// (quest; streaming reads none, the oracle every key instead: keys_scanned) and the KV of K pages (bytes-matched:
// quest_matched_pages + 1), or every token when P <= K). Returns {attention bytes, metadata bytes (the oracle's key
// pass included)}.
std::pair<double, double> quest_step_bytes_model(const ModelConfig& c, const QuestSettings& q, int len);

}  // namespace quest
