#pragma once
// Token-level key sketches (issue 26; CPU reference): page selectors that score every token of a page
// approximately, from a few bits per key channel, instead of bounding the page by its per-channel min and max.
// Quest's bound takes each channel's min or max from whichever key has it, so a page of near-misses outranks the
// page that holds the answer; a sketch keeps which key has which value.
//
// The sketch of a key k (one KV head): for the c channels of the head with the largest key energy (mean^2 + var
// over the keys of the complete pages), a code of `bits` bits per channel (1, 2 or 4: Lloyd-Max levels of a
// Gaussian of the channel's mean mu_i and standard deviation sd_i; 16: the value itself); the other channels
// decode to mu_i. The approximate logit of query head h for token t is
//     s(h, t) = sum_{i sketched} q_i * dec_i(code(t, i)) + sum_{i not sketched} q_i * mu_i
// and a page's score is, per query head, max_t s(h, t) (score "max"), or its estimated share of the softmax mass,
// sum_{t in page} exp(scale * s(h, t)) / sum_{every sketched token} exp(scale * s(h, t)) (score "lse"); the group
// aggregates them as Quest does (kv-sum: sum in head order, kv-max: max, per-head: its own).
//
// The channel statistics (mu, sd, energy order) are the head's calibration: here computed from the keys of the
// complete pages of the prompt itself (the CPU stand-in for a calibration stored beside the model or fixed at the
// end of the prefill; the bytes model counts its tables as read every step).
//
// Every sketch selector is bytes-matched to fp16 Quest at the same budget: it reads as many pages of KV as fit in
// the bytes Quest reads at this step after its own (sketch_pages below), so the step never reads more than Quest.
// Bytes of its own, per KV head (SelectionReads::sketch_bytes):
//     sketched_pages * ceil(S * c * bits / 8)   the sketches of the pages it scores (every complete page, or the
//                                               shortlist), packed per page
//   + c * 5                                     the calibration tables (fp16 mu, fp16 sd, the channel's index)
//   + ceil(c * bits / 8)                        the current token's sketch, written at append time
//   + (P - 1) * (D + 4)                         shortlist only: int4 page bounds of every complete page
#include <cstdint>
#include <string_view>
#include <vector>

#include "kernels/select/quest.h"

namespace quest {

struct SketchConfig {
    int bits = 2;            // bits per sketched channel: 1, 2, 4, or 16 (the value itself)
    int channel_num = 1;     // channels sketched c = head_dim * num / den - less (at least 1)
    int channel_den = 1;
    int channel_less = 1;
    bool lse = false;        // page score: false = max over the page's tokens, true = estimated softmax share
    int shortlist = 0;       // 0: sketch every complete page. x > 0: int4 page bounds pick x * n pages, the sketch
                             // re-ranks them to the n read (n bytes-matched)
    int channels(int head_dim) const;
    int bytes_per_token(int head_dim) const;  // ceil(c * bits / 8)
};

// Per KV head: mean, standard deviation and energy order of each channel over keys [0, tokens).
struct SketchCalibration {
    std::vector<float> mu, sd;
    std::vector<int> order;  // channels by energy mu^2 + sd^2, highest first (ties: lower channel)
};
SketchCalibration sketch_calibrate_ref(const float* keys, int tokens, int head_dim);

// The decoded value of channel i's code for value x (a code per bits: levels of a Gaussian, see the .cpp).
float sketch_decode_ref(float x, float mu, float sd, int bits);

// s(h, t) for tokens [0, tokens) of one KV head: out[t]. Sketched channels = the first c of cal.order.
void sketch_logits_ref(float* out, const float* q, const float* keys, int tokens, int head_dim,
                       const SketchCalibration& cal, const SketchConfig& cfg);

// Pages besides the last a sketch selector reads at this step, with its own bytes `ours` per KV head
// (sketches, tables, write, shortlist bounds): min(P - 1, floor((quest - ours - rows * last * 4D) / (rows * S * 4D)))
// where quest is fp16 Quest's bytes for the KV head at this step (codes::matched_pages with meta_pages = 1).
int sketch_matched_pages(const QuestSelectArgs& a, int64_t ours);

// The selector: per selection row the top-n complete pages by the sketch score (ties -> lower page), the last page
// added; with a shortlist, the top x*n by the int4 bound first. block_size = S.
void sketch_select_ref(const QuestSelectArgs& a, const SketchConfig& cfg, Selection& out);
// Its reads without running it (for StepShape); equals what sketch_select_ref counts.
SelectionReads sketch_step_reads(const SketchConfig& cfg, int len, int page_size, int page_budget, int head_dim,
                                 int num_heads, int num_kv_heads, GqaPolicy policy);

// The configuration of a sketch selector by name (sketch.cpp's variants); null for another name.
const SketchConfig* sketch_config_of(std::string_view name);
struct PageSelectorDef;
// Appends the sketch selectors' definitions (registry.cpp's built-in table calls it once).
void append_sketch_selectors(std::vector<PageSelectorDef>& defs);

}  // namespace quest
