#include "decoders/device_logits.h"

#include <algorithm>
#include <string>

#include "base/errors.h"

namespace oga {

namespace {

size_t ElementSize(OgaExtLogitsType type) { return type == OgaExtLogitsType_Float16 ? 2 : 4; }

[[noreturn]] void Fail(const char* what, int32_t status, char* message, size_t capacity) {
  message[capacity - 1] = '\0';
  if (status == static_cast<int32_t>(OgaExtExecutionStatus_Interrupted)) {
    throw InterruptedError(std::string("the device's ") + what + " was interrupted");
  }
  throw DeviceError(std::string("the device's ") + what + " failed: " + (message[0] != '\0' ? message : "no reason given"));
}

}  // namespace

DeviceLogits::DeviceLogits(const OgaExtDeviceOps* ops, size_t max_rows, size_t max_logits_rows, size_t vocab_size)
    : ops_(ops), vocab_size_(vocab_size), mirror_slot_(max_logits_rows, -1) {
  logits_rows_.reserve(max_rows);
  temperatures_.reserve(max_rows);
  top_ks_.reserve(max_rows);
  top_ps_.reserve(max_rows);
  seeds_.reserve(max_rows);
  counters_.reserve(max_rows);
  mask_eos_.reserve(max_rows);
  penalties_.reserve(max_rows);
  history_offsets_.reserve(max_rows + 1);
  tokens_.reserve(max_rows);
  read_rows_.reserve(max_logits_rows);
  read_sources_.reserve(max_rows);
  read_destinations_.reserve(max_rows);
  // The mirror grows on the first read-back (most steps read nothing back: a vocabulary of 150k
  // would make a batch-sized fp32 mirror hundreds of megabytes of mostly idle host memory).
}

void DeviceLogits::ClearSamples() {
  logits_rows_.clear();
  temperatures_.clear();
  top_ks_.clear();
  top_ps_.clear();
  seeds_.clear();
  counters_.clear();
  mask_eos_.clear();
  penalties_.clear();
  history_offsets_.assign(1, 0);
  history_tokens_.clear();
}

void DeviceLogits::AddSample(int32_t logits_row, const SamplingParams& params, uint64_t seed, uint64_t counter,
                             bool mask_eos, const std::vector<int32_t>& history) {
  logits_rows_.push_back(logits_row);
  temperatures_.push_back(params.greedy ? 0.0f : params.temperature);
  top_ks_.push_back(params.top_k);
  top_ps_.push_back(params.top_p);
  seeds_.push_back(seed);
  counters_.push_back(counter);
  mask_eos_.push_back(mask_eos ? 1 : 0);
  penalties_.push_back(params.repetition_penalty);
  // Only a penalized row needs its sequence on the device.
  if (params.repetition_penalty != 1.0f) history_tokens_.insert(history_tokens_.end(), history.begin(), history.end());
  history_offsets_.push_back(static_cast<int64_t>(history_tokens_.size()));
}

const int32_t* DeviceLogits::Sample(const OgaExtStepOutputs& outputs, const std::vector<int32_t>& eos_ids) {
  const size_t rows = logits_rows_.size();
  tokens_.assign(rows, -1);
  if (rows == 0) return tokens_.data();
  OgaExtDeviceSampling sampling{};
  sampling.num_rows = rows;
  sampling.logits = outputs.logits;
  sampling.logits_type = outputs.logits_type;
  sampling.logits_row_stride = outputs.logits_row_stride;
  sampling.vocab_size = vocab_size_;
  sampling.logits_rows = logits_rows_.data();
  sampling.temperatures = temperatures_.data();
  sampling.top_ks = top_ks_.data();
  sampling.top_ps = top_ps_.data();
  sampling.seeds = seeds_.data();
  sampling.counters = counters_.data();
  sampling.mask_eos = mask_eos_.data();
  sampling.eos_ids = eos_ids.data();
  sampling.num_eos = eos_ids.size();
  sampling.repetition_penalties = penalties_.data();
  sampling.history_offsets = history_offsets_.data();
  sampling.history_tokens = history_tokens_.data();
  sampling.tokens = tokens_.data();
  char message[512] = {};
  if (const int32_t status = ops_->sample(ops_->context, &sampling, message, sizeof(message)); status != 0) {
    Fail("sampling", status, message, sizeof(message));
  }
  for (const int32_t token : tokens_) {
    if (token < -1 || token >= static_cast<int64_t>(vocab_size_)) {
      throw DeviceError("the device's sampling returned token " + std::to_string(token) + " for a vocabulary of " +
                        std::to_string(vocab_size_));
    }
  }
  return tokens_.data();
}

void DeviceLogits::ClearReads() {
  for (const size_t row : read_rows_) mirror_slot_[row] = -1;
  read_rows_.clear();
}

void DeviceLogits::MarkRead(size_t row, size_t logits_rows) {
  if (row >= logits_rows || row >= mirror_slot_.size()) {
    throw ContractError("logits row " + std::to_string(row) + " is outside the step's " + std::to_string(logits_rows) +
                        " rows");
  }
  if (mirror_slot_[row] >= 0) return;
  mirror_slot_[row] = static_cast<int32_t>(read_rows_.size());
  read_rows_.push_back(row);
}

void DeviceLogits::Read(const OgaExtStepOutputs& outputs) {
  const size_t count = read_rows_.size();
  if (count == 0) return;
  const size_t row_bytes = vocab_size_ * ElementSize(outputs.logits_type);
  if (mirror_.size() < count * row_bytes) mirror_.resize(std::max(count * row_bytes, mirror_.size() * 2));
  read_sources_.resize(count);
  read_destinations_.resize(count);
  const size_t source_stride = outputs.logits_row_stride * ElementSize(outputs.logits_type);
  for (size_t i = 0; i < count; ++i) {
    read_sources_[i] = static_cast<const uint8_t*>(outputs.logits) + read_rows_[i] * source_stride;
    read_destinations_[i] = mirror_.data() + i * row_bytes;
  }
  char message[512] = {};
  if (const int32_t status = ops_->read(ops_->context, count, read_sources_.data(), read_destinations_.data(),
                                       row_bytes, message, sizeof(message));
      status != 0) {
    Fail("logits read", status, message, sizeof(message));
  }
}

LogitsRow DeviceLogits::HostRow(size_t row, OgaExtLogitsType type) const {
  const int32_t slot = row < mirror_slot_.size() ? mirror_slot_[row] : -1;
  if (slot < 0) throw ContractError("logits row " + std::to_string(row) + " was not read back from the device");
  LogitsRow logits;
  logits.data = mirror_.data() + static_cast<size_t>(slot) * vocab_size_ * ElementSize(type);
  logits.type = type;
  return logits;
}

}  // namespace oga
