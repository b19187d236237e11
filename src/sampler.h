// Token selection over one logits row. This engine decodes greedily; the batched sampler
// of the generation-policy work replaces Select for sampled turns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "oga/oga_ext.h"

namespace oga {

struct LogitsRow {
  const void* data = nullptr;
  OgaExtLogitsType type = OgaExtLogitsType_Float32;
};

// Index of the largest logit (lowest index on ties, NaN never wins). When `mask_eos` is set the ids in
// `eos_ids` are never chosen. Returns -1 if every candidate is masked or NaN.
int32_t SelectGreedy(const LogitsRow& row, size_t vocab_size, const std::vector<int32_t>& eos_ids, bool mask_eos);

// IEEE half -> float.
float HalfToFloat(uint16_t half);

}  // namespace oga
