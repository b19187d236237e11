#include "attention_math.h"

#include "library_state.h"

#include <algorithm>
#include <cmath>

namespace ortops {

namespace {

float Dot(const float* a, const float* b, int D) {
  float sum = 0.0f;
  for (int d = 0; d < D; ++d) sum += a[d] * b[d];
  return sum;
}

void DecodeScores(const float* q, int heads, int group, const float* k, size_t slot_stride, int n, int D, float* S,
                  size_t s_stride, const float* /*ahead0*/, const float* /*ahead1*/) {
  const int padded = PaddedHeads(heads);
  for (int j = 0; j < n; ++j) {
    const float* slot = k + j * slot_stride;
    float* row = S + j * s_stride;
    for (int h = 0; h < heads; ++h) row[h] = Dot(q + static_cast<size_t>(h) * D, slot + (h / group) * D, D);
    for (int h = heads; h < padded; ++h) row[h] = 0.0f;
  }
}

void SoftmaxColumns(float* S, int n, size_t s_stride, int columns, float* maxes, float* sums) {
  for (int h = 0; h < columns; ++h) {
    float m = S[h];
    for (int j = 1; j < n; ++j) m = std::max(m, S[j * s_stride + h]);
    float sum = 0.0f;
    for (int j = 0; j < n; ++j) {
      float& x = S[j * s_stride + h];
      x = std::exp(x - m);
      sum += x;
    }
    maxes[h] = m;
    sums[h] = sum;
  }
}

void DecodeAccumulate(const float* S, size_t s_stride, int heads, int group, const float* v, size_t slot_stride, int n,
                      int D, float* o) {
  for (int j = 0; j < n; ++j) {
    const float* slot = v + j * slot_stride;
    for (int h = 0; h < heads; ++h) {
      const float w = S[j * s_stride + h];
      const float* value = slot + (h / group) * D;
      float* out = o + static_cast<size_t>(h) * D;
      for (int d = 0; d < D; ++d) out[d] += w * value[d];
    }
  }
}

float ExpShiftedSum(float* x, int n, float shift) {
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

void TileScores(const float* Q, int rows, const float* k, size_t stride, int n, int D, float* S, size_t s_stride,
                float* /*pack*/) {
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < n; ++j) S[r * s_stride + j] = Dot(Q + static_cast<size_t>(r) * D, k + j * stride, D);
}

void TileAccumulate(const float* P, size_t p_stride, int rows, const float* v, size_t stride, int n, int D,
                    float* O) {
  for (int r = 0; r < rows; ++r) {
    float* out = O + static_cast<size_t>(r) * D;
    for (int j = 0; j < n; ++j) {
      const float w = P[r * p_stride + j];
      const float* value = v + j * stride;
      for (int d = 0; d < D; ++d) out[d] += w * value[d];
    }
  }
}

bool CpuHasAvx2Fma() {
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

}  // namespace

const AttentionMath kPortableMath = {DecodeScores,  SoftmaxColumns, DecodeAccumulate, ExpShiftedSum,
                                     TileScores,    TileAccumulate, "portable"};

const AttentionMath& SelectMath(int head_dim) {
  static const AttentionMath* vector = CpuHasAvx2Fma() ? Avx2Math() : nullptr;
  if (vector != nullptr && head_dim % 8 == 0 && !PortableForced()) return *vector;
  return kPortableMath;
}

}  // namespace ortops
