// The logits processors that run on device before selection, in place, in the CPU engine's order
// (src/sampling/sampler.cpp ProcessLogits): first the EOS floor (min-length masking), then the repetition
// penalty. fp16 rows are processed in float and stored back rounded to nearest, so a penalized fp16
// logit can differ from the CPU's float result by half an fp16 ulp.
//
// `logits_rows` (may be null) maps a batch row to its row of the logits buffer, as in sampling.cu.
#include "device_support.cuh"

// EOS floor: while a row has generated fewer tokens than its minimum, every EOS id is -inf.
// Launch: one thread per (row, EOS id) pair, any 1-D shape; ids outside [0, vocab) are ignored.
template <typename Logit>
__device__ void oga_mask_eos_rows(Logit* logits, long long row_stride, int vocab_size, int num_rows,
                                  const int* logits_rows, const int* generated, const int* min_generated,
                                  const int* eos_ids, int num_eos) {
  const long long pairs = static_cast<long long>(num_rows) * num_eos;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < pairs;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(i / num_eos);
    const int eos = eos_ids[i % num_eos];
    if (generated[r] >= min_generated[r] || eos < 0 || eos >= vocab_size) continue;
    const long long source = logits_rows != nullptr ? logits_rows[r] : r;
    oga_store_negative_infinity(logits + source * row_stride, eos);
  }
}

// Repetition penalty over each row's token history, given as CSR: the tokens of row r are
// history_tokens[history_offsets[r], history_offsets[r + 1]). Each distinct token in [0, vocab) is
// penalized once, however often it occurs: a positive logit is divided by the penalty, any other
// multiplied. A per-row bitmap in shared memory decides which thread owns each distinct token
// (whoever sets its bit first), so the history needs no sort and no vocabulary-sized scratch.
// Launch: grid (rows) or fewer, any block size; dynamic shared memory 4 * ceil(vocab / 32) bytes
// (above 48 KiB, a vocabulary above 393,216 tokens, the function's maximum dynamic shared size must
// be raised; the loader does). Rows with penalty 1 are left untouched.
template <typename Logit>
__device__ void oga_repetition_penalty_rows(Logit* logits, long long row_stride, int vocab_size, int num_rows,
                                            const int* logits_rows, const float* penalties,
                                            const long long* history_offsets, const int* history_tokens) {
  OGA_DYNAMIC_SHARED(unsigned int, seen);
  const int words = (vocab_size + 31) / 32;
  for (int r = blockIdx.x; r < num_rows; r += gridDim.x) {
    const float penalty = penalties[r];
    if (penalty == 1.0f) continue;  // uniform over the block: no thread reaches the barriers below
    const long long source = logits_rows != nullptr ? logits_rows[r] : r;
    Logit* row = logits + source * row_stride;
    for (int i = threadIdx.x; i < words; i += blockDim.x) seen[i] = 0u;
    __syncthreads();
    for (long long i = history_offsets[r] + threadIdx.x; i < history_offsets[r + 1]; i += blockDim.x) {
      const int token = history_tokens[i];
      if (token < 0 || token >= vocab_size) continue;
      const unsigned int bit = 1u << (token & 31);
      if (atomicOr(&seen[token >> 5], bit) & bit) continue;  // another occurrence owns it
      const float logit = oga_load_logit(row, token);
      oga_store_logit(row, token, logit > 0.0f ? logit / penalty : logit * penalty);
    }
    __syncthreads();  // the bitmap is cleared for the next row only after every thread is done
  }
}

extern "C" __global__ void oga_mask_eos_f32(float* logits, long long row_stride, int vocab_size, int num_rows,
                                            const int* logits_rows, const int* generated, const int* min_generated,
                                            const int* eos_ids, int num_eos) {
  oga_mask_eos_rows(logits, row_stride, vocab_size, num_rows, logits_rows, generated, min_generated, eos_ids, num_eos);
}

extern "C" __global__ void oga_mask_eos_f16(unsigned short* logits, long long row_stride, int vocab_size,
                                            int num_rows, const int* logits_rows, const int* generated,
                                            const int* min_generated, const int* eos_ids, int num_eos) {
  oga_mask_eos_rows(logits, row_stride, vocab_size, num_rows, logits_rows, generated, min_generated, eos_ids, num_eos);
}

extern "C" __global__ void oga_repetition_penalty_f32(float* logits, long long row_stride, int vocab_size,
                                                      int num_rows, const int* logits_rows, const float* penalties,
                                                      const long long* history_offsets,
                                                      const int* history_tokens) {
  oga_repetition_penalty_rows(logits, row_stride, vocab_size, num_rows, logits_rows, penalties, history_offsets,
                              history_tokens);
}

extern "C" __global__ void oga_repetition_penalty_f16(unsigned short* logits, long long row_stride, int vocab_size,
                                                      int num_rows, const int* logits_rows, const float* penalties,
                                                      const long long* history_offsets,
                                                      const int* history_tokens) {
  oga_repetition_penalty_rows(logits, row_stride, vocab_size, num_rows, logits_rows, penalties, history_offsets,
                              history_tokens);
}
