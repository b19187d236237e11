/*
 * logits_head.h -- oga.LogitsHead: the LM head of the rows that need logits, logits = x . W^T, and
 * each row's largest logit in every block of kLogitsBlock columns, taken while the block is still
 * in cache. Greedy selection then reads the block maxima and the one winning block instead of the
 * whole row again: the logits of a large vocabulary are written while the head streams its weight
 * (SmolLM2: 113 MB for 16 x 49152 logits), so a second pass reads them back from memory.
 *
 *   0 x             float [rows, hidden]
 *   1 weight        float [vocab, hidden]   a constant initializer (the Hugging Face layout of
 *                                           lm_head.weight, or the tied embedding table)
 *
 *   0 logits        float [rows, vocab]
 *   1 block_maxima  float [rows, ceil(vocab / kLogitsBlock)]  (optional) the largest logit of each
 *                   block, NaN ignored; -inf when no value of the block exceeds -inf
 *
 * The weight is packed once, when the session creates the kernel, into panels of kPanel columns
 * ([vocab / kPanel][hidden][kPanel], zero-padded), the layout the AVX2 kernel streams. Every logit is
 * one fixed-order sum over hidden, whatever the number of rows, so a row's logits do not depend on
 * the batch it runs in.
 */
#ifndef OGA_ORTOPS_LOGITS_HEAD_H_
#define OGA_ORTOPS_LOGITS_HEAD_H_

#include <cstdint>
#include <cstdlib>
#include <memory>

#include "op_kernel.h"

namespace ortops {

// The block of the maxima output; the engine's greedy selection (src/sampling/first_max.cpp) reads
// blocks of the same size.
constexpr int64_t kLogitsBlock = 1024;

// The loops of the head: panels [p0, p1) of the packed weight against `rows` rows of x
// (x row r at x + r * hidden), logits row r at y + r * vocab; a panel past `vocab` writes only the
// columns below it.
struct LogitsHeadMath {
  void (*panels)(const float* x, int64_t rows, int64_t hidden, const float* packed, int64_t p0, int64_t p1,
                 int64_t vocab, float* y);
  // The largest value of data[0, count), NaN ignored; -inf when none exceeds -inf.
  float (*block_max)(const float* data, int64_t count);
  const char* name;
};

constexpr int64_t kPanel = 16;

const LogitsHeadMath& SelectLogitsHeadMath();
extern const LogitsHeadMath kPortableLogitsHeadMath;
const LogitsHeadMath* Avx2LogitsHeadMath();  // NULL when this build has none

class LogitsHead {
 public:
  static constexpr const char* kName = "LogitsHead";
  static const InputSpec kInputs[];
  static constexpr size_t kNumInputs = 2;
  static const OutputSpec kOutputs[];
  static constexpr size_t kNumOutputs = 2;

  explicit LogitsHead(const KernelInfo& info);
  void Compute(KernelCall& call);

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> packed_;
  int64_t vocab_ = 0, hidden_ = 0;
};

}  // namespace ortops

#endif  // OGA_ORTOPS_LOGITS_HEAD_H_
