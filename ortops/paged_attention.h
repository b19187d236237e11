/*
 * paged_attention.h -- oga.PagedGroupQueryAttention: rotary embedding, the cache write and grouped-query
 * attention over a paged KV cache, in one CPU operator that reads the cache blocks in place.
 *
 * It takes the step in OGA's paged layout (the same inputs a paged decoder graph has):
 *
 *   0 query          float [N, Hq*D], or [N, (Hq + 2*Hkv)*D] packed q|k|v when key/value are absent
 *                    (a leading batch dimension of 1 is allowed: [1, N, ...], the output then has it too)
 *   1 key            float [N, Hkv*D] (optional)
 *   2 value          float [N, Hkv*D] (optional)
 *   3 key_cache      float or float16 [num_blocks, block_size, Hkv, D]
 *   4 value_cache    the key cache's type and shape
 *   5 block_table    int32 [B, max_blocks]: position p of row r lives in block block_table[r][p / block_size],
 *                    slot p % block_size
 *   6 cumulative_sequence_lengths  int32 [B + 1]: row r owns packed tokens cu[r] .. cu[r+1]-1
 *   7 past_sequence_lengths        int32 [B]: positions already in the cache per row
 *   8 cos_cache      float [max_positions, R/2] (with do_rotary: R = rotary dims, R <= D)
 *   9 sin_cache      float [max_positions, R/2]
 *  10 offset_input   float [N, k]       (optional, packed query only: the q|k|v projection's block
 *  11 offset_weights float16 [k/32, W]   offsets, see block_offsets.h)
 *  12 head_sink      float [Hq]         (optional) one attention-sink logit per query head: it joins
 *                    each softmax's denominator as exp(sink) and contributes no value (GPT-OSS)
 *  13 cos_cache_long float [max_positions, R/2]  (with rope_switch_length only: LongRoPE's long
 *  14 sin_cache_long float [max_positions, R/2]   tables)
 *
 *   0 output         float [N, Hq*D]
 *   1 present_key    the key cache's type and shape: the cache after this step's writes
 *   2 present_value
 *
 * Attributes: num_heads (Hq), kv_num_heads (Hkv; Hq a multiple of it), scale (default 1/sqrt(D)),
 * do_rotary (0/1), rotary_interleaved (0: rotate halves, as Hugging Face Llama; 1: rotate pairs),
 * local_window_size (-1: none; W > 0: a query at p sees keys p-W < k <= p, W keys, as ONNX Runtime's
 * GroupQueryAttention),
 * softcap (0: none; c > 0: each scaled score s becomes c * tanh(s / c) before the softmax, as
 * GroupQueryAttention's softcap), rope_switch_length (0: none; L > 0: LongRoPE, a row whose length
 * after this step, past + its tokens, exceeds L rotates with the long tables 13/14, the others with
 * 8/9: the choice onnxruntime-genai's LongRoPE graphs make for a whole batch, made per row).
 *
 * Token t of row r is at position p = past[r] + (t - cu[r]). Its (rotated) key and its value are
 * written to the cache first; then it attends to positions 0..p of its row (the window's part of
 * them), which are all in the cache: earlier steps wrote them, this step wrote the rest. Nothing
 * is gathered or copied per step: keys and values are read where they are. Bind present_* to the
 * same memory as key_cache / value_cache (as OGA's engines do) and the cache is updated in place;
 * given distinct buffers, the operator first copies the whole cache into the output (correct, but
 * a copy per step).
 *
 * Work is spread over ONNX Runtime's intra-op threads in units, longest first: a decoding row's
 * keys in chunks (partial softmax sums merged afterwards), a prefilling row's queries in tiles of
 * 16 tokens per kv head.
 */
#ifndef OGA_ORTOPS_PAGED_ATTENTION_H_
#define OGA_ORTOPS_PAGED_ATTENTION_H_

#include "op_kernel.h"

namespace ortops {

class PagedGroupQueryAttention {
 public:
  static constexpr const char* kName = "PagedGroupQueryAttention";
  static constexpr size_t kNumInputs = 15;
  static constexpr size_t kNumOutputs = 3;

  explicit PagedGroupQueryAttention(const KernelInfo& info);
  void Compute(KernelCall& call);

 private:
  int num_heads_;
  int kv_num_heads_;
  float scale_;  // 0: 1/sqrt(head_dim)
  bool do_rotary_;
  bool rotary_interleaved_;
  int window_;  // 0: none
  float softcap_;  // 0: none
  int64_t rope_switch_length_;  // 0: one pair of RoPE tables
};

// The operator is registered twice under its one name: ONNX Runtime picks the kernel by the
// graph's cache type (float32 or float16 caches and presents), and both run the same code.
struct PagedGroupQueryAttentionFloatCache : PagedGroupQueryAttention {
  using PagedGroupQueryAttention::PagedGroupQueryAttention;
  static const InputSpec kInputs[];
  static const OutputSpec kOutputs[];
};
struct PagedGroupQueryAttentionHalfCache : PagedGroupQueryAttention {
  using PagedGroupQueryAttention::PagedGroupQueryAttention;
  static const InputSpec kInputs[];
  static const OutputSpec kOutputs[];
};

}  // namespace ortops

#endif  // OGA_ORTOPS_PAGED_ATTENTION_H_
