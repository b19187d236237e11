// C API: the step API of onnxruntime-genai 0.10-0.15 (step_requests.h).
#include <memory>
#include <string>
#include <vector>

#include "config/search_options.h"
#include "capi/c_api_support.h"
#include "engine/engine.h"
#include "capi/handles.h"
#include "oga/oga.h"
#include "compat/step_requests.h"

using oga::ApiError;
using oga::Guard;
using oga::RequireNotNull;

namespace {

const std::shared_ptr<oga::StepRequest>& StepOf(const OgaRequest* request) {
  RequireNotNull(request, "request must not be null.");
  if (!request->step) {
    throw ApiError("This request was created by OgaEngineCreateRequest: the step API takes requests created by "
                   "OgaCreateRequest.");
  }
  return request->step;
}

// The one token sequence a step-API call takes.
const std::vector<int32_t>& OneSequence(const OgaSequences* sequences) {
  RequireNotNull(sequences, "tokens must not be null.");
  if (sequences->sequences.size() != 1) {
    throw ApiError("A request is one sequence: pass exactly one token sequence (got " +
                   std::to_string(sequences->sequences.size()) + ").");
  }
  return sequences->sequences.front();
}

OgaResult* AddInput(OgaRequest* request, const OgaSequences* tokens, bool continuation) {
  return Guard([&] {
    const std::shared_ptr<oga::StepRequest>& step = StepOf(request);
    const std::vector<int32_t>& sequence = OneSequence(tokens);
    oga::StepDriver* driver = nullptr;
    {
      std::lock_guard<std::mutex> lock(step->mutex);
      if (step->AddInput(sequence.data(), sequence.size(), continuation)) driver = step->driver;
    }
    if (driver != nullptr) driver->Continue(step);
  });
}

}  // namespace

extern "C" {

OgaResult* OGA_API_CALL OgaCreateRequest(const OgaGeneratorParams* params, OgaRequest** out) {
  return Guard([&] {
    if (out != nullptr) *out = nullptr;
    RequireNotNull(params, "params must not be null.");
    RequireNotNull(out, "out must not be null.");
    if (params->search.num_beams != 1) {
      throw ApiError("num_beams (" + std::to_string(params->search.num_beams) +
                     "): beam search is not supported by oga's engine; every request decodes one sequence.");
    }
    // A step-API request is one sequence within the model's context, as a Generator row is.
    oga::CheckedMaxLength(params->search, params->model->config().context_length);
    if (params->search.batch_size != 1) {
      throw ApiError("batch_size (" + std::to_string(params->search.batch_size) +
                     ") must be 1 for a step-API request: every request decodes one sequence.");
    }
    if (params->search.num_return_sequences != 1) {
      throw ApiError("num_return_sequences (" + std::to_string(params->search.num_return_sequences) +
                     ") must be in [1, 1]");
    }
    if (!params->guidance_type.empty()) {
      throw ApiError("Guidance on a step-API request is not supported by oga; use TurnOptions.set_guidance with the "
                     "Engine's turns.");
    }
    auto handle = std::make_unique<OgaRequest>();
    handle->step = std::make_shared<oga::StepRequest>(params->model, params->search);
    handle->step->handle.store(handle.get(), std::memory_order_release);
    *out = handle.release();
  });
}

OgaResult* OGA_API_CALL OgaRequestAddTokens(OgaRequest* request, const OgaSequences* tokens) {
  return AddInput(request, tokens, false);
}

OgaResult* OGA_API_CALL OgaRequestContinue(OgaRequest* request, const OgaSequences* tokens) {
  return AddInput(request, tokens, true);
}

OgaResult* OGA_API_CALL OgaRequestHasUnseenTokens(const OgaRequest* request, bool* out) {
  return Guard([&] {
    if (out != nullptr) *out = false;
    const std::shared_ptr<oga::StepRequest>& step = StepOf(request);
    RequireNotNull(out, "out must not be null.");
    std::lock_guard<std::mutex> lock(step->mutex);
    *out = step->has_unseen();
  });
}

OgaResult* OGA_API_CALL OgaRequestGetUnseenToken(OgaRequest* request, int32_t* out) {
  return Guard([&] {
    if (out != nullptr) *out = 0;
    const std::shared_ptr<oga::StepRequest>& step = StepOf(request);
    RequireNotNull(out, "out must not be null.");
    std::lock_guard<std::mutex> lock(step->mutex);
    if (!step->has_unseen()) {
      if (!step->failure.empty()) throw ApiError(step->failure);
      throw ApiError("All tokens have been seen.");
    }
    *out = step->unseen[step->unseen_read++];
  });
}

OgaResult* OGA_API_CALL OgaRequestIsDone(const OgaRequest* request, bool* out) {
  return Guard([&] {
    if (out != nullptr) *out = false;
    const std::shared_ptr<oga::StepRequest>& step = StepOf(request);
    RequireNotNull(out, "out must not be null.");
    std::lock_guard<std::mutex> lock(step->mutex);
    *out = step->state == oga::StepRequestState::TurnComplete || step->state == oga::StepRequestState::Removed;
  });
}

OgaResult* OGA_API_CALL OgaRequestIsTurnComplete(const OgaRequest* request, bool* out) {
  return OgaRequestIsDone(request, out);
}

OgaResult* OGA_API_CALL OgaRequestSetOpaqueData(OgaRequest* request, void* data) {
  return Guard([&] { StepOf(request)->opaque.store(data, std::memory_order_release); });
}

OgaResult* OGA_API_CALL OgaRequestGetOpaqueData(OgaRequest* request, void** out) {
  return Guard([&] {
    if (out != nullptr) *out = nullptr;
    const std::shared_ptr<oga::StepRequest>& step = StepOf(request);
    RequireNotNull(out, "out must not be null.");
    *out = step->opaque.load(std::memory_order_acquire);
  });
}

OgaResult* OGA_API_CALL OgaEngineAddRequest(OgaEngine* engine, OgaRequest* request) {
  return Guard([&] {
    RequireNotNull(engine, "engine must not be null.");
    engine->steps->AddRequest(StepOf(request));
  });
}

OgaResult* OGA_API_CALL OgaEngineRemoveRequest(OgaEngine* engine, OgaRequest* request) {
  return Guard([&] {
    RequireNotNull(engine, "engine must not be null.");
    engine->steps->RemoveRequest(StepOf(request));
  });
}

OgaResult* OGA_API_CALL OgaEngineStep(OgaEngine* engine, OgaRequest** out) {
  return Guard([&] {
    if (out != nullptr) *out = nullptr;
    RequireNotNull(engine, "engine must not be null.");
    RequireNotNull(out, "out must not be null.");
    oga::StepRequest* ready = engine->steps->Step();
    *out = ready != nullptr ? ready->handle.load(std::memory_order_acquire) : nullptr;
  });
}

}  // extern "C"
