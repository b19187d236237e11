#include "decoders/hybrid_decoder_io.h"

#include "base/errors.h"

namespace oga {

const OgaExtStepInputs& HybridDecoderIO::Pack(const StepPlan& plan, const PagedKeyValueCache& cache) {
  const FixedStatePool* pool = cache.fixed_state();
  if (pool == nullptr || !pool->reservation_live() || pool->reserved_rows() != plan.rows.size()) {
    throw ContractError("the step has no fixed-state reservation for its rows");
  }
  for (size_t r = 0; r < plan.rows.size(); ++r) {
    if (pool->reserved_owner(r) != plan.rows[r].request) {
      throw ContractError("a fixed-state binding row belongs to another request than its packed row");
    }
  }
  inputs_ = varlen_.Pack(plan, cache);
  inputs_.num_fixed_states = pool->tensor_count();
  inputs_.fixed_state_inputs = pool->inputs();
  inputs_.fixed_state_outputs = pool->outputs();
  inputs_.fixed_state_captures = pool->captures();
  inputs_.fixed_state_direct = pool->direct() ? 1 : 0;
  return inputs_;
}

}  // namespace oga
