#include "attention_math.h"

#include <algorithm>
#include <cmath>

#include "library_state.h"

namespace ortops {

namespace {

template <typename T>
float Dot(const float* a, const T* b, int D) {
  float sum = 0.0f;
  for (int d = 0; d < D; ++d) sum += a[d] * ToFloat(b[d]);
  return sum;
}

template <typename T>
void DecodeScores(const float* q, int heads, int group, const T* k, size_t slot_stride, int n, int D, float* S,
                  size_t s_stride, const T* /*ahead0*/, const T* /*ahead1*/) {
  const int padded = PaddedHeads(heads);
  for (int j = 0; j < n; ++j) {
    const T* slot = k + j * slot_stride;
    float* row = S + j * s_stride;
    for (int h = 0; h < heads; ++h) row[h] = Dot(q + static_cast<size_t>(h) * D, slot + (h / group) * D, D);
    for (int h = heads; h < padded; ++h) row[h] = 0.0f;
  }
}

template <typename T>
void DecodeAccumulate(const float* S, size_t s_stride, int heads, int group, const T* v, size_t slot_stride, int n,
                      int D, float* o) {
  for (int j = 0; j < n; ++j) {
    const T* slot = v + j * slot_stride;
    for (int h = 0; h < heads; ++h) {
      const float w = S[j * s_stride + h];
      const T* value = slot + (h / group) * D;
      float* out = o + static_cast<size_t>(h) * D;
      for (int d = 0; d < D; ++d) out[d] += w * ToFloat(value[d]);
    }
  }
}

template <typename T>
void TileScores(const float* Q, int rows, const T* k, size_t stride, int n, int D, float* S, size_t s_stride,
                float* /*pack*/) {
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < n; ++j) S[r * s_stride + j] = Dot(Q + static_cast<size_t>(r) * D, k + j * stride, D);
}

template <typename T>
void TileAccumulate(const float* P, size_t p_stride, int rows, const T* v, size_t stride, int n, int D, float* O) {
  for (int r = 0; r < rows; ++r) {
    float* out = O + static_cast<size_t>(r) * D;
    for (int j = 0; j < n; ++j) {
      const float w = P[r * p_stride + j];
      const T* value = v + j * stride;
      for (int d = 0; d < D; ++d) out[d] += w * ToFloat(value[d]);
    }
  }
}

void StoreFloat(const float* x, int D, float* out) { std::copy(x, x + D, out); }

void StoreHalf(const float* x, int D, Half* out) {
  for (int d = 0; d < D; ++d) out[d] = FloatToHalf(x[d]);
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

float ExpShiftedSum(float* x, int n, float shift) {
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

}  // namespace

const AttentionMath kPortableMath = {
    {DecodeScores<float>, DecodeAccumulate<float>, TileScores<float>, TileAccumulate<float>, StoreFloat},
    {DecodeScores<Half>, DecodeAccumulate<Half>, TileScores<Half>, TileAccumulate<Half>, StoreHalf},
    SoftmaxColumns,
    ExpShiftedSum,
    "portable",
};

const AttentionMath& SelectMath(int head_dim) {
  static const AttentionMath* vector = CpuHasAvx2FmaF16c() ? Avx2Math() : nullptr;
  if (vector != nullptr && head_dim % 8 == 0 && !PortableForced()) return *vector;
  return kPortableMath;
}

}  // namespace ortops
