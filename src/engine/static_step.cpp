// The static batching path's step: waves of requests run to completion over contiguous caches.
#include "engine/engine.h"

#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <random>
#include <utility>

#include "base/mix64.h"
#include "sampling/sampler.h"
#include "engine/engine_support.h"

namespace oga {
using engine_detail::NowNs;
using engine_detail::StatusOfCaughtException;
using engine_detail::UsageOf;

void Engine::StepStatic() {
  StaticStepKind kind = StaticStepKind::None;
  const OgaExtStaticStepInputs* inputs = nullptr;
  std::vector<StaticRow>& rows = static_scheduler_->rows();
  try {
    kind = static_scheduler_->PlanStep();
    if (kind == StaticStepKind::None) return;
    inputs = &static_io_->Pack(kind, rows);
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& error) {
    MarkUnhealthy(OgaErrorCode_EngineContractFailure, "Static scheduler", error.what());
    return;
  }
  const uint64_t start = NowNs();
  OgaExtStepOutputs outputs{};
  ExecutionResult result = executor_.ExecuteStatic(*inputs, outputs);
  counters_.executor_ns += NowNs() - start;
  ++counters_.model_runs;
  if (result.status == OgaExtExecutionStatus_Ok) {
    if (const std::string failure = CheckLogitsOutputs(outputs, rows.size()); !failure.empty()) {
      result.status = OgaExtExecutionStatus_Fatal;
      result.message = "the executor returned " + failure;
    }
  }
  // A failed static step has mutated no request: the rows simply run the same step again.
  if (result.status != OgaExtExecutionStatus_Ok) {
    EndFailedStep(result.status, OgaErrorCode_EngineExecutionFailure, "Static-batch execution", result.message);
    return;
  }
  try {
    std::vector<SelectionRow>& selection = selector_.rows();
    size_t count = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      Request& request = *rows[r].request;
      static_staged_[r] = StagedResult{};
      if (!request.schedulable()) continue;
      selection[count++] = SelectionRow{&request, r, &static_staged_[r], nullptr};
    }
    selector_.Select(count, outputs);
  } catch (...) {
    std::string cause;
    const OgaExtExecutionStatus status = StatusOfCaughtException(cause);
    EndFailedStep(status, OgaErrorCode_EngineExecutionFailure, "Token selection", cause);
    return;
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    StaticRow& row = rows[r];
    Request& request = *row.request;
    if (!request.schedulable()) continue;  // frozen row
    request.processed = kind == StaticStepKind::Decode ? request.processed + 1 : request.tokens.size();
    row.processed = request.processed;
    PublishToken(request, static_staged_[r]);
    // What the row is fed once its turn has ended: its own next token, or padding after EOS.
    row.frozen_token = request.processed < request.tokens.size() ? request.tokens[request.processed]
                                                                 : model_->config().pad_token_id;
  }
  ++counters_.committed_steps;
  counters_.step_ns += NowNs() - start;
}

}  // namespace oga
