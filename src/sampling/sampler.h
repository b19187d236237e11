// Token selection over one logits row: greedy selection, the logits processors, and sampling (the
// definition OgaExtDeviceSampling's device samplers must reproduce).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "oga/oga_ext.h"

namespace oga {

struct LogitsRow {
  const void* data = nullptr;
  OgaExtLogitsType type = OgaExtLogitsType_Float32;
  // The row's OgaExtStepOutputs.logits_block_maxima (float32 rows only); NULL when the executor
  // gave none.
  const float* block_maxima = nullptr;
};

// Index of the largest logit (lowest index on ties, NaN never wins). When `mask_eos` is set the ids in
// `eos_ids` are never chosen. Returns -1 if every candidate is masked or NaN.
int32_t SelectGreedy(const LogitsRow& row, size_t vocab_size, const std::vector<int32_t>& eos_ids, bool mask_eos);

// IEEE half -> float.
float HalfToFloat(uint16_t half);

// One row's token-selection settings, the one struct the host sampler (ProcessLogits,
// SampleProcessed), the device batch (DeviceLogits::AddSample) and a turn's policy (TurnPolicy)
// share: a new sampling setting is a field here.
struct SamplingParams {
  bool greedy = true;  // do_sample false, top_k 1 or temperature 0: the top logit, no randomness
  float temperature = 1.0f;
  int32_t top_k = 0;   // 0 = no top-k cut
  float top_p = 1.0f;  // >= 1 = no nucleus cut
  float repetition_penalty = 1.0f;
  int32_t no_repeat_ngram_size = 0;

  bool processes_logits() const { return repetition_penalty != 1.0f || no_repeat_ngram_size > 0; }
};

// Per-engine scratch for logits processing and sampling, sized to the vocabulary once, so a step
// allocates nothing.
struct SamplingScratch {
  static constexpr size_t kBuckets = 4096;
  explicit SamplingScratch(size_t vocab_size)
      : logits(vocab_size), seen(vocab_size, 0), order(vocab_size), probabilities(vocab_size), weights(vocab_size),
        block_mass(vocab_size / 64 + 1), spare_order(vocab_size), bucket_mass(2 * kBuckets) {}
  std::vector<float> logits;
  std::vector<uint8_t> seen;
  std::vector<int32_t> order;
  std::vector<double> probabilities;  // sorted candidates
  // Many candidates: their weights, and buckets by log-probability so that only the bucket the
  // nucleus ends in is sorted.
  std::vector<float> weights;
  std::vector<double> block_mass;  // sums of weights per block of 64 tokens
  std::vector<int32_t> spare_order;
  std::vector<double> bucket_mass;
};

// Copies a logits row's first `vocab_size` logits to `out` as float (float16 rows widened).
void LoadLogits(const LogitsRow& row, size_t vocab_size, float* out);
// Guidance: every token whose bit (bit t % 32 of allowed[t / 32]) is clear becomes -inf.
void ApplyAllowedMask(const uint32_t* allowed, SamplingScratch& scratch);
// The logits processors, in 0.18's order after guidance: EOS masked while the turn is below its
// minimum, repetition penalty over every distinct token of the sequence (positive logits divided,
// negative multiplied), and no-repeat n-gram (tokens that would repeat an n-gram of the sequence).
// `params` gives repetition_penalty and no_repeat_ngram_size.
void ProcessLogits(const std::vector<int32_t>& sequence, const std::vector<int32_t>& eos_ids, bool mask_eos,
                   const SamplingParams& params, SamplingScratch& scratch);
// Index of the largest processed logit (lowest index on ties); -1 if every logit is -inf or NaN.
int32_t ArgMaxProcessed(const SamplingScratch& scratch);
// Temperature, then the top_k largest (0 = all; ties: lowest index first), softmax, then the
// smallest prefix of the (logit descending, index ascending) order reaching top_p (when
// 0 < top_p < 1), then one draw from `stream`.
// `params` gives temperature, top_k and top_p.
int32_t SampleProcessed(const SamplingParams& params, class RandomStream& stream, SamplingScratch& scratch);

}  // namespace oga
