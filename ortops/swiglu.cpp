#include "swiglu.h"

#include <algorithm>
#include <string>

#include "block_offsets.h"
#include "row_math.h"

namespace ortops {

using namespace ortapi;

const InputSpec SwiGlu::kInputs[] = {{kFloat, false}, {kFloat, true}, {kFloat16, true}};
const OutputSpec SwiGlu::kOutputs[] = {{kFloat, false}};

namespace {
struct RowTag;
constexpr int64_t kRowsPerTask = 8;
}  // namespace

void SwiGlu::Compute(KernelCall& call) {
  Tensor gate_up = call.Input(0);
  RequireTensor(gate_up, "gate_up", kFloat, 2);
  const int64_t rows = gate_up.dim(0), width = gate_up.dim(1), half = width / 2;
  Require(width % 2 == 0, "gate_up " + gate_up.ShapeText() + " must have an even number of columns (gate|up)");
  BlockOffsets offsets(call, 1, rows, width);
  Tensor output = call.Output(0, {rows, half});
  const RowMath& math = SelectRowMath();
  const float* in = gate_up.as<float>();
  float* out = output.as<float>();
  auto task = [&](size_t t) {
    const int64_t begin = static_cast<int64_t>(t) * kRowsPerTask, end = std::min(rows, begin + kRowsPerTask);
    float* row = offsets.present() ? ThreadScratch<RowTag>(static_cast<size_t>(width)) : nullptr;
    for (int64_t r = begin; r < end; ++r) {
      const float* x = offsets.Corrected(r, in + r * width, row);
      math.swiglu(x, x + half, half, out + r * half);
    }
  };
  call.ParallelFor(static_cast<size_t>((rows + kRowsPerTask - 1) / kRowsPerTask), task);
}

}  // namespace ortops
