// Turn policy resolution: every unset option means the request's search default for this turn, never
// what the previous turn used. The complete policy is validated before BeginTurn mutates anything.
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "base/errors.h"
#include "config/model_config.h"
#include "request/turn_options.h"

namespace oga {
namespace {

// 0.18 prints floats with six decimals: -1.000000, nan, inf.
std::string Decimal(double value) {
  char text[64];
  std::snprintf(text, sizeof(text), "%f", value);
  return text;
}

// A turn value when the turn set one, else the request's search default.
template <typename Turn, typename Default>
Default Pick(const std::optional<Turn>& turn, Default model) {
  return turn ? static_cast<Default>(*turn) : model;
}

}  // namespace

TurnPolicy ResolveTurnPolicy(const SearchConfig& search, const TurnOptionValues* values, size_t vocab_size) {
  const TurnOptionValues none;
  const TurnOptionValues& v = values != nullptr ? *values : none;
  TurnPolicy policy;
  policy.max_generated_tokens = v.max_generated_tokens;
  policy.min_generated_tokens = v.min_generated_tokens;
  const bool do_sample = Pick(v.do_sample, search.do_sample);
  const double temperature = Pick(v.temperature, search.temperature);
  const double top_p = Pick(v.top_p, search.top_p);
  const int64_t top_k = Pick(v.top_k, search.top_k);
  const double repetition_penalty = Pick(v.repetition_penalty, search.repetition_penalty);
  const int64_t no_repeat_ngram_size = Pick(v.no_repeat_ngram_size, search.no_repeat_ngram_size);

  if (!std::isfinite(temperature) || temperature < 0) {
    throw ApiError("temperature (" + Decimal(temperature) + ") must be finite and 0 or greater.");
  }
  if (!std::isfinite(top_p) || top_p < 0 || top_p > 1) {
    throw ApiError("top_p (" + Decimal(top_p) + ") must be finite and between 0.0 and 1.0.");
  }
  if (top_k < 0) throw ApiError("top_k (" + std::to_string(top_k) + ") must be 0 or greater.");
  if (!std::isfinite(repetition_penalty) || repetition_penalty <= 0) {
    throw ApiError("repetition_penalty (" + Decimal(repetition_penalty) + ") must be finite and greater than zero.");
  }
  if (no_repeat_ngram_size < 0) {
    throw ApiError("no_repeat_ngram_size (" + std::to_string(no_repeat_ngram_size) + ") must be 0 or greater.");
  }

  const bool greedy = !do_sample || top_k == 1 || temperature == 0;
  if (greedy && v.do_sample && *v.do_sample) {
    // The turn asked for sampling, but a model default the turn did not override selects the top logit.
    const char* field = nullptr;
    if (!v.top_k && search.top_k == 1) field = "search.top_k = 1";
    if (!v.temperature && search.temperature == 0) field = field ? field : "search.temperature = 0";
    if (field != nullptr && !(v.top_k && *v.top_k == 1) && !(v.temperature && *v.temperature == 0)) {
      throw ApiError(std::string("do_sample=true was explicitly set, but this turn still selects the top logit "
                                 "because the model's own search defaults supply ") +
                     field +
                     ". Set that field explicitly on the turn -- top_k above 1, or a nonzero temperature -- to "
                     "request sampling, or drop do_sample to accept top-logit selection.");
    }
  }
  if (greedy) {
    std::vector<std::string> contradicting;
    if (v.temperature && *v.temperature != 0 && *v.temperature != 1) contradicting.push_back("temperature");
    if (v.top_p && *v.top_p > 0 && *v.top_p < 1) contradicting.push_back("top_p");
    if (v.top_k && *v.top_k > 1) contradicting.push_back("top_k");
    if (!contradicting.empty()) {
      const char* cause = !do_sample ? "do_sample is false" : top_k == 1 ? "top_k is 1" : "temperature is 0";
      std::string names;
      for (const std::string& name : contradicting) names += (names.empty() ? "" : ", ") + name;
      throw ApiError(std::string("The resolved turn policy selects the top logit (") + cause +
                     "), so these explicitly set sampling options contradict it: " + names +
                     ". Either remove them or request sampling with do_sample=true, top_k != 1, and a nonzero "
                     "temperature.");
    }
  } else {
    if (top_k == 0 && top_p == 0) throw ApiError("A sampled turn requires a positive top_k or a positive top_p; both are 0.");
    if (static_cast<uint64_t>(top_k) > vocab_size) {
      if (v.top_k) {
        throw ApiError("top_k (" + std::to_string(top_k) + ") must be less than or equal to vocab_size (" +
                       std::to_string(vocab_size) + ").");
      }
      throw ApiError("The model's search.top_k (" + std::to_string(top_k) + ") exceeds vocab_size (" +
                     std::to_string(vocab_size) + "). Set top_k explicitly to a value no greater than vocab_size.");
    }
  }
  // A temperature so small that 1 / temperature overflows float (below ~2.9e-39) is the limit of
  // sampling as the temperature goes to 0: the top logit. Sampled, its scaling would turn the top
  // logit into NaN (0 x inf).
  const bool too_cold = !greedy && !(1.0f / static_cast<float>(temperature) <= std::numeric_limits<float>::max());
  policy.greedy = greedy || too_cold;
  policy.temperature = static_cast<float>(temperature);
  policy.top_k = static_cast<int32_t>(top_k);
  policy.top_p = static_cast<float>(top_p);
  policy.repetition_penalty = static_cast<float>(repetition_penalty);
  policy.no_repeat_ngram_size = static_cast<int32_t>(no_repeat_ngram_size);
  policy.seed = v.seed;
  return policy;
}

}  // namespace oga
