// HybridDecoderIO: the packed variable-length inputs of VarlenDecoderIO plus the fixed-state
// bindings of the live reservation (hybrid models), one row per plan row in execution order.
// Packed token order and logits handling are VarlenDecoderIO's, unchanged.
#pragma once

#include "oga/oga_ext.h"
#include "cache/paged_cache.h"
#include "plan/step_plan.h"
#include "decoders/varlen_decoder_io.h"

namespace oga {

class HybridDecoderIO {
 public:
  explicit HybridDecoderIO(VarlenDecoderIO& varlen) : varlen_(varlen) {}

  // Packs `plan` and appends the fixed bindings; throws ContractError when the cache's fixed-state
  // reservation does not hold the plan's rows in the plan's order.
  const OgaExtStepInputs& Pack(const StepPlan& plan, const PagedKeyValueCache& cache);
  const OgaExtStepInputs& inputs() const { return inputs_; }

 private:
  VarlenDecoderIO& varlen_;
  OgaExtStepInputs inputs_{};
};

}  // namespace oga
