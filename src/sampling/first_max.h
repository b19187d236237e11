// The first occurrence of the largest value of a float row: greedy token selection's one pass over
// the logits (for SmolLM2's 49152-entry rows this pass is most of an engine step's own time).
#pragma once

#include <cstddef>

#include "oga/oga_ext.h"

namespace oga {

struct FirstMaxResult {
  size_t index;  // the first index holding `value`; `count` when no value exceeds -inf
  float value;   // the largest value, NaN ignored; -inf when none exceeds -inf
};

// One pass over data[0, count) in blocks of block maxima, then the winning block (1024 values)
// again: AVX2 where the CPU has it (checked once; OGA_SAMPLER_PORTABLE=1 selects SSE2), else
// SSE2, else scalar.
FirstMaxResult FirstMax(const float* data, size_t count);

// The largest value of data[0, count), NaN ignored; -inf when none exceeds -inf (block_max.h's loops,
// AVX2 or SSE2 as FirstMax picks them).
float BlockMax(const float* data, size_t count);

// The blocks FirstMax reads, and those of OgaExtStepOutputs.logits_block_maxima.
constexpr size_t kFirstMaxBlock = OGA_EXT_LOGITS_BLOCK;

// FirstMax from the row's block maxima (block_maxima[b]: the largest value of data[b * 1024, ...),
// NaN ignored, -inf if none; see OgaExtStepOutputs.logits_block_maxima): reads the maxima and the
// winning block only. Maxima that do not match the data (no value of the winning block equals its
// maximum) fall back to FirstMax over the whole row.
FirstMaxResult FirstMaxOfBlocks(const float* data, size_t count, const float* block_maxima);

}  // namespace oga
