// Token selection when a step's logits stay on the executor's device (OgaExtStepOutputs
// .logits_on_device): the rows whose policy the device sampler supports are selected there in one
// batched OgaExtDeviceOps.sample call; only the logits rows the host must see (guidance, no-repeat
// n-grams, draft verification, a row the device left without a candidate) are read back, into a
// host mirror. Every array is preallocated at the batch limit; the mirror and the history grow
// geometrically, so a steady workload allocates nothing per step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "oga/oga_ext.h"
#include "base/random_stream.h"
#include "sampling/sampler.h"

namespace oga {

class DeviceLogits {
 public:
  // `ops` must provide `read`; `sample` may be NULL (every row is then selected on the host).
  DeviceLogits(const OgaExtDeviceOps* ops, size_t max_rows, size_t max_logits_rows, size_t vocab_size);

  static bool Supported(const OgaExtDeviceOps* ops) { return ops != nullptr && ops->read != nullptr; }
  bool can_sample() const { return ops_->sample != nullptr; }

  // ---- the device batch ----
  void ClearSamples();
  // Adds a row reading logits row `logits_row` with `params` (a greedy row goes with temperature 0),
  // drawing from the stream (seed, counter).
  void AddSample(int32_t logits_row, const SamplingParams& params, uint64_t seed, uint64_t counter, bool mask_eos,
                 const std::vector<int32_t>& history);
  // Runs OgaExtDeviceOps.sample; returns the selected ids (-1: no candidate). Throws DeviceError.
  const int32_t* Sample(const OgaExtStepOutputs& outputs, const std::vector<int32_t>& eos_ids);
  // Batch row `row`'s stream after the one draw a sampled row makes on the device.
  RandomStream StreamAfterDraw(size_t row) const { return RandomStream(seeds_[row], counters_[row] + 1); }

  // ---- rows read back ----
  void ClearReads();
  // Marks logits row `row` (of `logits_rows` the step returned) to be read; repeated marks read once.
  void MarkRead(size_t row, size_t logits_rows);
  // The rows marked since ClearReads (what Read brings back; read_sources_ keeps an older step's size
  // when nothing is marked).
  size_t read_count() const { return read_rows_.size(); }
  // Reads every marked row into the mirror (one OgaExtDeviceOps.read call). Throws DeviceError, or
  // std::bad_alloc when the mirror cannot grow.
  void Read(const OgaExtStepOutputs& outputs);
  // The host copy of a row Read brought back.
  LogitsRow HostRow(size_t row, OgaExtLogitsType type) const;

 private:
  const OgaExtDeviceOps* ops_;
  const size_t vocab_size_;
  // The batch, in OgaExtDeviceSampling's layout.
  std::vector<int32_t> logits_rows_;
  std::vector<float> temperatures_;
  std::vector<int32_t> top_ks_;
  std::vector<float> top_ps_;
  std::vector<uint64_t> seeds_;
  std::vector<uint64_t> counters_;
  std::vector<int32_t> mask_eos_;
  std::vector<float> penalties_;
  std::vector<int64_t> history_offsets_;
  std::vector<int32_t> history_tokens_;
  std::vector<int32_t> tokens_;
  // Read-back: mirror slot of each logits row (-1: not read), the marked rows, and the mirror
  // ([slots, vocab_size] elements of the step's logits type).
  std::vector<int32_t> mirror_slot_;
  std::vector<size_t> read_rows_;
  std::vector<const void*> read_sources_;
  std::vector<void*> read_destinations_;
  std::vector<uint8_t> mirror_;
};

}  // namespace oga
