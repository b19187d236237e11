// Per-turn generation policy as the caller set it (OgaTurnOptions) and as BeginTurn resolves it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sampling/sampler.h"

namespace oga {

class Request;

// Every field unset means "the request's search default for this turn" (never the previous turn).
struct TurnOptionValues {
  uint64_t max_generated_tokens = 0;  // 0 = no per-turn cap
  uint64_t min_generated_tokens = 0;  // 0 = no floor
  std::optional<bool> do_sample;
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int32_t> top_k;
  std::optional<float> repetition_penalty;
  std::optional<int32_t> no_repeat_ngram_size;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop_strings;
  std::string guidance_type;  // whole-turn guidance; empty = none
  std::string guidance_data;
  std::optional<int32_t> delimited_opening_token;  // delimited guidance; unset = none
  int32_t delimited_closing_token = -1;
  std::string delimited_grammar;
};

// The policy one turn runs with, resolved at BeginTurn from the request's search defaults and the
// turn's options (turn_policy.cpp).
// A turn's policy: its token-selection settings (SamplingParams) and its lifecycle bounds.
struct TurnPolicy : SamplingParams {
  uint64_t max_generated_tokens = 0;
  uint64_t min_generated_tokens = 0;
  std::optional<uint64_t> seed;  // reseeds the request's stream at the turn's first sampling step
};

struct SearchConfig;

// Resolves and validates a turn's policy (snapshotted at BeginTurn, seed: "Request lifecycle"); throws
// ApiError with 0.18's rules and messages, which tests/test_sampling.py pins.
// max/min_generated_tokens are copied; their checks against the sequence are the engine's.
TurnPolicy ResolveTurnPolicy(const SearchConfig& search, const TurnOptionValues* values, size_t vocab_size);

}  // namespace oga

// C handle: bound to one request through a weak reference.
struct OgaTurnOptions {
  std::weak_ptr<oga::Request> request;
  oga::TurnOptionValues values;
};
