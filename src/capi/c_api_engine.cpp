// C API: engines, requests, turn options, event buffers and events (OGA 0.18 surface).
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "capi/c_api_support.h"
#include "engine/engine.h"
#include "capi/handles.h"
#include "compat/step_requests.h"
#include "oga/oga.h"
#include "oga/oga_ext.h"

using oga::ApiError;
using oga::Guard;
using oga::RequireNotNull;

namespace {

constexpr size_t kMaxEventCapacity = size_t{1} << 24;
constexpr size_t kMaxStopStrings = 16;
constexpr size_t kMaxStopStringBytes = 16384;

oga::Engine& EngineOf(OgaEngine* engine) { return *engine->engine; }
const oga::Engine& EngineOf(const OgaEngine* engine) { return *engine->engine; }

// The live engine of an open request; the caller already rejected closed requests.
oga::Engine& EngineOf(oga::Request& request) {
  oga::Engine* engine = request.engine();
  if (engine == nullptr) throw ApiError(oga::kClosedRequestMessage);
  return *engine;
}

// The engine request of a handle of this API; a step-API handle (OgaCreateRequest) has none.
oga::Request& CoreOf(const OgaRequest* request) {
  if (!request->request) {
    throw ApiError("This request was created by OgaCreateRequest (the step API): use it with OgaEngineAddRequest "
                   "and OgaEngineStep.");
  }
  return *request->request;
}

// Validates a turn-options handle for a setter and returns its request.
oga::Request& CheckTurnOptions(const OgaTurnOptions* options) {
  RequireNotNull(options, "options must not be null.");
  // A released request stays usable until the engine reclaims it at its next owner-thread boundary
  // (as in 0.18); only then does the weak reference expire.
  std::shared_ptr<oga::Request> request = options->request.lock();
  if (!request) throw ApiError("Cannot use Turn options after their Request has been destroyed.");
  if (request->closed()) throw ApiError(oga::kClosedRequestMessage);
  EngineOf(*request).CheckOwnerThread();
  return *request;  // kept alive by its handle, which the check above saw
}

// Runs a setter body on validated turn options.
template <typename Update>
OgaResult* UpdateTurnOptions(OgaTurnOptions* options, Update&& update) {
  return Guard([&] {
    CheckTurnOptions(options);
    update(options->values);
  });
}

bool IsValidUtf8(const std::string& text) {
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    size_t extra;
    uint32_t code;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1;
      code = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2;
      code = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3;
      code = c & 0x07;
    } else {
      return false;
    }
    for (size_t k = 1; k <= extra; ++k) {
      if (i + k >= n) return false;
      const unsigned char follow = static_cast<unsigned char>(text[i + k]);
      if ((follow & 0xC0) != 0x80) return false;
      code = (code << 6) | (follow & 0x3F);
    }
    // Reject overlong forms, surrogates and values past U+10FFFF.
    if ((extra == 1 && code < 0x80) || (extra == 2 && code < 0x800) || (extra == 3 && code < 0x10000) ||
        code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) {
      return false;
    }
    i += extra + 1;
  }
  return true;
}

template <typename T>
OgaResult* GetField(const OgaEngineEvent* event, T* out, T zero, T value_of(const OgaEngineEvent&)) {
  if (out != nullptr) *out = zero;
  if (event == nullptr) return oga::MakeResult("event must not be null.");
  if (out == nullptr) return oga::MakeResult("out must not be null.");
  *out = value_of(*event);
  return nullptr;
}

OgaResult* GetUsageField(const OgaTurnUsage* usage, uint64_t* out, uint64_t OgaTurnUsage::*field) {
  if (out != nullptr) *out = 0;
  if (usage == nullptr) return oga::MakeResult("usage must not be null.");
  if (out == nullptr) return oga::MakeResult("out must not be null.");
  *out = usage->*field;
  return nullptr;
}

}  // namespace

extern "C" {

/* ----------------------------------------------------------------------------------------------
 * Engine lifecycle
 * -------------------------------------------------------------------------------------------- */
OgaResult* OGA_API_CALL OgaCreateEngine(OgaModel* model, OgaEngine** out) {
  return Guard([&] {
    if (out != nullptr) *out = nullptr;
    RequireNotNull(model, "model must not be null.");
    RequireNotNull(out, "out must not be null.");
    auto handle = std::make_unique<OgaEngine>();
    handle->engine = oga::Engine::Create(model->model);
    handle->steps = std::make_shared<oga::StepDriver>(handle->engine);
    *out = handle.release();
  });
}

void OGA_API_CALL OgaDestroyEngine(OgaEngine* engine) {
  if (engine == nullptr) return;
  engine->steps->Teardown();
  engine->engine->Teardown();
  delete engine;
}

OgaResult* OGA_API_CALL OgaEngineHasPendingRequests(OgaEngine* engine, bool* out) {
  return Guard([&] {
    RequireNotNull(engine, "engine must not be null.");
    RequireNotNull(out, "out must not be null.");
    *out = engine->steps->HasPendingRequests();  // the engine's own work, and the step API's
  });
}

OgaResult* OGA_API_CALL OgaEngineMaxDraftTokensPerProposal(const OgaEngine* engine, size_t* out) {
  return Guard([&] {
    RequireNotNull(engine, "engine must not be null.");
    RequireNotNull(out, "out must not be null.");
    EngineOf(engine).CheckOwnerThread();
    *out = EngineOf(engine).max_draft_tokens();
  });
}

/* ----------------------------------------------------------------------------------------------
 * Request options
 * -------------------------------------------------------------------------------------------- */
OgaResult* OGA_API_CALL OgaCreateRequestOptions(OgaRequestOptions** out) {
  return Guard([&] {
    RequireNotNull(out, "out must not be null.");
    *out = new OgaRequestOptions();
  });
}

void OGA_API_CALL OgaDestroyRequestOptions(OgaRequestOptions* options) { delete options; }

OgaResult* OGA_API_CALL OgaRequestOptionsSetMaxSessionTokens(OgaRequestOptions* options, uint64_t max_session_tokens) {
  return Guard([&] {
    RequireNotNull(options, "options must not be null.");
    options->max_session_tokens = max_session_tokens;
  });
}

/* ----------------------------------------------------------------------------------------------
 * Requests
 * -------------------------------------------------------------------------------------------- */
static OgaResult* CreateRequestHandle(OgaEngine* engine, const oga::SearchConfig* search,
                                      const OgaRequestOptions* request_options, OgaRequest** out) {
  return Guard([&] {
    if (out != nullptr) *out = nullptr;
    RequireNotNull(engine, "engine must not be null.");
    RequireNotNull(out, "out must not be null.");
    oga::Engine& core = EngineOf(engine);
    auto handle = std::make_unique<OgaRequest>();
    handle->request = core.CreateRequest(request_options, search != nullptr ? *search : core.model().config().search);
    handle->engine = engine->engine;
    handle->request->handle.store(handle.get(), std::memory_order_release);
    *out = handle.release();
  });
}

OgaResult* OGA_API_CALL OgaEngineCreateRequest(OgaEngine* engine, const OgaRequestOptions* request_options,
                                               OgaRequest** out) {
  return CreateRequestHandle(engine, nullptr, request_options, out);
}

OgaResult* OGA_API_CALL OgaExtEngineCreateRequestWithParams(OgaEngine* engine, const OgaGeneratorParams* params,
                                                            const OgaRequestOptions* request_options,
                                                            OgaRequest** out) {
  if (params == nullptr) {
    if (out != nullptr) *out = nullptr;
    return oga::MakeResult("params must not be null.");
  }
  if (engine != nullptr && params->model.get() != &EngineOf(engine).model()) {
    // The params' search defaults (vocabulary bounds, EOS ids) are the other model's.
    if (out != nullptr) *out = nullptr;
    return oga::MakeResult("The GeneratorParams were created for another model than the engine's.");
  }
  return CreateRequestHandle(engine, &params->search, request_options, out);
}

OgaResult* OGA_API_CALL OgaRequestBeginTurn(OgaRequest* request, const OgaTurnOptions* turn_options,
                                            const int32_t* input_ids, uint64_t input_ids_count, uint64_t* out_turn_id) {
  return Guard([&] {
    RequireNotNull(request, "request must not be null.");
    RequireNotNull(out_turn_id, "out_turn_id must not be null.");
    *out_turn_id = 0;  // 0 = no turn, also when the call fails below (as 0.18)
    if (input_ids == nullptr && input_ids_count != 0) {
      throw ApiError("input_ids must not be null when input_ids_count is nonzero.");
    }
    oga::Request& core = CoreOf(request);
    if (core.closed()) throw ApiError(oga::kClosedRequestMessage);
    *out_turn_id = EngineOf(core).BeginTurn(core, turn_options, input_ids, input_ids_count);
  });
}

OgaResult* OGA_API_CALL OgaRequestCancelTurn(OgaRequest* request, uint64_t turn_id, bool* out_cancelled) {
  return Guard([&] {
    RequireNotNull(request, "request must not be null.");
    RequireNotNull(out_cancelled, "out_cancelled must not be null.");
    oga::Request& core = CoreOf(request);
    if (core.closed()) throw ApiError("Cannot cancel after the request's engine has been destroyed.");
    *out_cancelled = EngineOf(core).CancelTurn(core, turn_id);
  });
}

OgaResult* OGA_API_CALL OgaRequestRewindToStartOfTurn(OgaRequest* request, uint64_t turn_id) {
  return Guard([&] {
    RequireNotNull(request, "request must not be null.");
    oga::Request& core = CoreOf(request);
    if (core.closed()) throw ApiError("Cannot rewind a closed request.");
    EngineOf(core).RewindToStartOfTurn(core, turn_id);
  });
}

OgaResult* OGA_API_CALL OgaRequestClose(OgaRequest* request) {
  return Guard([&] {
    RequireNotNull(request, "request must not be null.");
    oga::Request& core = CoreOf(request);
    if (core.closed()) return;  // idempotent; also a tombstone of a destroyed engine
    EngineOf(core).Close(core);
  });
}

OgaResult* OGA_API_CALL OgaRequestSetDraftTokens(OgaRequest* request, const OgaSequences* tokens) {
  return Guard([&] {
    RequireNotNull(request, "request must not be null.");
    RequireNotNull(tokens, "tokens must not be null.");
    oga::Request& core = CoreOf(request);
    if (core.closed()) throw ApiError(oga::kClosedRequestMessage);
    EngineOf(core).CheckOwnerThread();
    if (tokens->sequences.size() > 1) throw ApiError("Request draft tokens must contain at most one sequence.");
    const std::vector<int32_t>* sequence = tokens->sequences.empty() ? nullptr : &tokens->sequences[0];
    EngineOf(core).SetDraftTokens(core, sequence != nullptr ? sequence->data() : nullptr,
                                  sequence != nullptr ? sequence->size() : 0);
  });
}

void OGA_API_CALL OgaDestroyRequest(OgaRequest* request) {
  if (request == nullptr) return;
  if (request->step) {
    // Released: its engine's owner thread removes it (and releases its cache) at its next Step or
    // HasPendingRequests.
    request->step->handle.store(nullptr, std::memory_order_release);
    delete request;
    return;
  }
  // Publish abandonment only; the engine closes the request at its next owner-thread boundary.
  request->request->handle.store(nullptr, std::memory_order_release);
  request->request->abandoned.store(true, std::memory_order_release);
  if (std::shared_ptr<oga::Engine> engine = request->engine.lock()) engine->NotifyAbandoned();
  delete request;
}

/* ----------------------------------------------------------------------------------------------
 * Turn options
 * -------------------------------------------------------------------------------------------- */
OgaResult* OGA_API_CALL OgaRequestCreateTurnOptions(OgaRequest* request, OgaTurnOptions** out) {
  return Guard([&] {
    RequireNotNull(request, "request must not be null.");  // *out untouched, as in 0.18
    RequireNotNull(out, "out must not be null.");
    *out = nullptr;
    oga::Request& core = CoreOf(request);
    if (core.closed()) throw ApiError(oga::kClosedRequestMessage);
    EngineOf(core).CheckOwnerThread();
    auto options = std::make_unique<OgaTurnOptions>();
    options->request = request->request;
    *out = options.release();
  });
}

void OGA_API_CALL OgaDestroyTurnOptions(OgaTurnOptions* options) { delete options; }

OgaResult* OGA_API_CALL OgaTurnOptionsSetMaxGeneratedTokens(OgaTurnOptions* options, uint64_t max_generated_tokens) {
  return UpdateTurnOptions(options, [&](oga::TurnOptionValues& values) { values.max_generated_tokens = max_generated_tokens; });
}

OgaResult* OGA_API_CALL OgaTurnOptionsSetMinGeneratedTokens(OgaTurnOptions* options, uint64_t min_generated_tokens) {
  return UpdateTurnOptions(options, [&](oga::TurnOptionValues& values) { values.min_generated_tokens = min_generated_tokens; });
}

OgaResult* OGA_API_CALL OgaTurnOptionsSetDoSample(OgaTurnOptions* options, bool do_sample) {
  return UpdateTurnOptions(options, [&](oga::TurnOptionValues& values) { values.do_sample = do_sample; });
}

OgaResult* OGA_API_CALL OgaTurnOptionsSetTemperature(OgaTurnOptions* options, float temperature) {
  return UpdateTurnOptions(options, [&](oga::TurnOptionValues& values) { values.temperature = temperature; });
}

OgaResult* OGA_API_CALL OgaTurnOptionsSetTopP(OgaTurnOptions* options, float top_p) {
  return UpdateTurnOptions(options, [&](oga::TurnOptionValues& values) { values.top_p = top_p; });
}

OgaResult* OGA_API_CALL OgaTurnOptionsSetTopK(OgaTurnOptions* options, int32_t top_k) {
  return UpdateTurnOptions(options, [&](oga::TurnOptionValues& values) { values.top_k = top_k; });
}

OgaResult* OGA_API_CALL OgaTurnOptionsSetRepetitionPenalty(OgaTurnOptions* options, float repetition_penalty) {
  return UpdateTurnOptions(options, [&](oga::TurnOptionValues& values) { values.repetition_penalty = repetition_penalty; });
}

OgaResult* OGA_API_CALL OgaTurnOptionsSetNoRepeatNgramSize(OgaTurnOptions* options, int32_t no_repeat_ngram_size) {
  return UpdateTurnOptions(options, [&](oga::TurnOptionValues& values) { values.no_repeat_ngram_size = no_repeat_ngram_size; });
}

OgaResult* OGA_API_CALL OgaTurnOptionsSetSeed(OgaTurnOptions* options, uint64_t seed) {
  return UpdateTurnOptions(options, [&](oga::TurnOptionValues& values) { values.seed = seed; });
}

OgaResult* OGA_API_CALL OgaTurnOptionsClearSeed(OgaTurnOptions* options) {
  return UpdateTurnOptions(options, [&](oga::TurnOptionValues& values) { values.seed.reset(); });
}

OgaResult* OGA_API_CALL OgaTurnOptionsSetStopStrings(OgaTurnOptions* options, const OgaStringArray* stop_strings) {
  return Guard([&] {
    CheckTurnOptions(options);
    RequireNotNull(stop_strings, "stop_strings must not be null.");
    const std::vector<std::string>& strings = stop_strings->strings;
    if (strings.size() > kMaxStopStrings) {
      throw ApiError("Too many stop strings: " + std::to_string(strings.size()) + ", the maximum is 16.");
    }
    size_t total = 0;
    for (size_t i = 0; i < strings.size(); ++i) {
      if (strings[i].empty()) throw ApiError("Stop string at index " + std::to_string(i) + " is empty.");
      if (!IsValidUtf8(strings[i])) throw ApiError("Stop string at index " + std::to_string(i) + " is not valid UTF-8.");
      total += strings[i].size();
    }
    if (total > kMaxStopStringBytes) {
      throw ApiError("Stop strings total " + std::to_string(total) + " bytes, the maximum is 16384.");
    }
    options->values.stop_strings = strings;  // a failed copy keeps the previous configuration
  });
}

OgaResult* OGA_API_CALL OgaTurnOptionsSetGuidance(OgaTurnOptions* options, const char* guidance_type,
                                                  const char* guidance_data) {
  return Guard([&] {
    CheckTurnOptions(options);
    if (guidance_type == nullptr || guidance_data == nullptr) {
      throw ApiError("guidance_type and guidance_data must not be null.");
    }
    const std::string type(guidance_type);
    const std::string data(guidance_data);
    if (type.empty() || data.empty()) throw ApiError("Guidance type and data must be provided together.");
    if (type != "json_schema" && type != "regex" && type != "lark_grammar") {
      throw ApiError("Unsupported guidance type: " + type +
                     " (only json_schema, regex, and lark_grammar are supported).");
    }
    if (options->values.delimited_opening_token) {
      throw ApiError(
          "Whole-turn guidance conflicts with delimited guidance. Use OgaTurnOptionsClearGuidance before changing "
          "guidance modes.");
    }
    options->values.guidance_type = type;
    options->values.guidance_data = data;
  });
}

OgaResult* OGA_API_CALL OgaTurnOptionsSetDelimitedGuidance(OgaTurnOptions* options, int32_t opening_token,
                                                           int32_t closing_token, const char* grammar) {
  return Guard([&] {
    CheckTurnOptions(options);
    RequireNotNull(grammar, "grammar must not be null.");
    if (grammar[0] == '\0') throw ApiError("Guidance type and data must be provided together.");
    if (opening_token < 0 || closing_token < 0 || opening_token == closing_token) {
      throw ApiError("opening_token and closing_token must be distinct nonnegative token IDs.");
    }
    if (!options->values.guidance_type.empty()) {
      throw ApiError(
          "Delimited guidance conflicts with whole-turn guidance. Use OgaTurnOptionsClearGuidance before changing "
          "guidance modes.");
    }
    options->values.delimited_grammar = grammar;
    options->values.delimited_opening_token = opening_token;
    options->values.delimited_closing_token = closing_token;
  });
}

OgaResult* OGA_API_CALL OgaTurnOptionsClearGuidance(OgaTurnOptions* options) {
  return Guard([&] {
    CheckTurnOptions(options);
    options->values.guidance_type.clear();
    options->values.guidance_data.clear();
    options->values.delimited_opening_token.reset();
    options->values.delimited_closing_token = -1;
    options->values.delimited_grammar.clear();
  });
}

OgaResult* OGA_API_CALL OgaTurnOptionsReset(OgaTurnOptions* options) {
  return Guard([&] {
    CheckTurnOptions(options);
    options->values = oga::TurnOptionValues{};
  });
}

/* ----------------------------------------------------------------------------------------------
 * Event buffers and Run
 * -------------------------------------------------------------------------------------------- */
OgaResult* OGA_API_CALL OgaCreateEngineEventBuffer(OgaEngine* engine, size_t capacity, OgaEngineEventBuffer** out) {
  return Guard([&] {
    if (out != nullptr) *out = nullptr;
    RequireNotNull(engine, "engine must not be null.");
    RequireNotNull(out, "out must not be null.");
    EngineOf(engine).CheckOwnerThread();
    if (capacity > kMaxEventCapacity) throw ApiError("Engine event capacity exceeds the supported size.");
    *out = new OgaEngineEventBuffer(EngineOf(engine).id(), capacity);
  });
}

void OGA_API_CALL OgaDestroyEngineEventBuffer(OgaEngineEventBuffer* buffer) { delete buffer; }

OgaResult* OGA_API_CALL OgaEngineRun(OgaEngine* engine, OgaEngineEventBuffer* buffer) {
  return Guard([&] {
    RequireNotNull(engine, "engine must not be null.");
    RequireNotNull(buffer, "buffer must not be null.");
    oga::Engine& core = EngineOf(engine);
    if (buffer->engine_id != core.id()) throw ApiError("buffer must be used with the Engine that created it.");
    core.CheckOwnerThread();
    if (engine->steps->serving()) {
      throw ApiError("This engine serves requests of the step API (OgaEngineAddRequest): drive it with "
                     "OgaEngineStep, whose events they are.");
    }
    core.Run(*buffer);
  });
}

OgaResult* OGA_API_CALL OgaExtEngineRequeueEvents(OgaEngine* engine, OgaEngineEventBuffer* buffer) {
  return Guard([&] {
    RequireNotNull(engine, "engine must not be null.");
    RequireNotNull(buffer, "buffer must not be null.");
    oga::Engine& core = EngineOf(engine);
    if (buffer->engine_id != core.id()) throw ApiError("buffer must be used with the Engine that created it.");
    core.Requeue(*buffer);
  });
}

size_t OGA_API_CALL OgaEngineEventBufferGetCount(const OgaEngineEventBuffer* buffer) {
  return buffer == nullptr ? 0 : buffer->count;
}

const OgaEngineEvent* OGA_API_CALL OgaEngineEventBufferGet(const OgaEngineEventBuffer* buffer, size_t index) {
  if (buffer == nullptr || index >= buffer->count) return nullptr;
  return &buffer->slots[index];
}

/* ----------------------------------------------------------------------------------------------
 * Events and usage
 * -------------------------------------------------------------------------------------------- */
OgaResult* OGA_API_CALL OgaEngineEventGetFlags(const OgaEngineEvent* event, OgaEngineEventFlags* out) {
  return GetField<OgaEngineEventFlags>(event, out, OgaEngineEventFlag_None,
                                       [](const OgaEngineEvent& e) { return e.flags; });
}

OgaResult* OGA_API_CALL OgaEngineEventGetRequest(const OgaEngineEvent* event, const OgaRequest** out) {
  if (out != nullptr) *out = nullptr;
  if (event == nullptr) return oga::MakeResult("event must not be null.");
  if (out == nullptr) return oga::MakeResult("out must not be null.");
  *out = event->request ? event->request->handle.load(std::memory_order_acquire) : nullptr;
  return nullptr;
}

OgaResult* OGA_API_CALL OgaEngineEventGetTurnId(const OgaEngineEvent* event, uint64_t* out) {
  return GetField<uint64_t>(event, out, 0, [](const OgaEngineEvent& e) { return e.turn_id; });
}

OgaResult* OGA_API_CALL OgaEngineEventGetToken(const OgaEngineEvent* event, int32_t* out) {
  return GetField<int32_t>(event, out, 0, [](const OgaEngineEvent& e) { return e.token; });
}

OgaResult* OGA_API_CALL OgaEngineEventGetFinishReason(const OgaEngineEvent* event, OgaFinishReason* out) {
  return GetField<OgaFinishReason>(event, out, OgaFinishReason_None,
                                   [](const OgaEngineEvent& e) { return e.finish_reason; });
}

OgaResult* OGA_API_CALL OgaEngineEventGetMatchedStopStringIndex(const OgaEngineEvent* event, int32_t* out) {
  return GetField<int32_t>(event, out, -1, [](const OgaEngineEvent& e) { return e.matched_stop_string_index; });
}

OgaResult* OGA_API_CALL OgaEngineEventGetErrorCode(const OgaEngineEvent* event, OgaErrorCode* out) {
  return GetField<OgaErrorCode>(event, out, OgaErrorCode_None, [](const OgaEngineEvent& e) { return e.error_code; });
}

OgaResult* OGA_API_CALL OgaEngineEventGetUsage(const OgaEngineEvent* event, const OgaTurnUsage** out) {
  if (out != nullptr) *out = nullptr;
  if (event == nullptr) return oga::MakeResult("event must not be null.");
  if (out == nullptr) return oga::MakeResult("out must not be null.");
  *out = &event->usage;
  return nullptr;
}

OgaResult* OGA_API_CALL OgaTurnUsageGetPromptTokens(const OgaTurnUsage* usage, uint64_t* out) {
  return GetUsageField(usage, out, &OgaTurnUsage::prompt_tokens);
}

OgaResult* OGA_API_CALL OgaTurnUsageGetGeneratedTokens(const OgaTurnUsage* usage, uint64_t* out) {
  return GetUsageField(usage, out, &OgaTurnUsage::generated_tokens);
}

OgaResult* OGA_API_CALL OgaTurnUsageGetCachedPromptTokens(const OgaTurnUsage* usage, uint64_t* out) {
  return GetUsageField(usage, out, &OgaTurnUsage::cached_prompt_tokens);
}

/* ----------------------------------------------------------------------------------------------
 * oga additions: binding support and introspection
 * -------------------------------------------------------------------------------------------- */
void OGA_API_CALL OgaExtRequestSetUserData(OgaRequest* request, void* user_data) {
  if (request != nullptr) request->user_data.store(user_data, std::memory_order_release);
}

void* OGA_API_CALL OgaExtRequestGetUserData(const OgaRequest* request) {
  return request == nullptr ? nullptr : request->user_data.load(std::memory_order_acquire);
}

uint64_t OGA_API_CALL OgaExtEngineEventBufferGetGeneration(const OgaEngineEventBuffer* buffer) {
  return buffer == nullptr ? 0 : buffer->generation;
}

size_t OGA_API_CALL OgaExtEngineEventBufferGetCapacity(const OgaEngineEventBuffer* buffer) {
  return buffer == nullptr ? 0 : buffer->slots.size();
}

OgaResult* OGA_API_CALL OgaExtEngineCheckInvariants(const OgaEngine* engine) {
  return Guard([&] {
    RequireNotNull(engine, "engine must not be null.");
    EngineOf(engine).CheckOwnerThread();
    const std::string violations = EngineOf(engine).CheckInvariants();
    if (!violations.empty()) throw ApiError("Engine invariants violated:\n" + violations);
  });
}

OgaResult* OGA_API_CALL OgaExtEngineGetCounters(const OgaEngine* engine, OgaExtEngineCounters* out) {
  return Guard([&] {
    RequireNotNull(engine, "engine must not be null.");
    RequireNotNull(out, "out must not be null.");
    const oga::Engine& core = EngineOf(engine);
    core.CheckOwnerThread();
    const oga::EngineCounters& counters = core.counters();
    out->model_runs = counters.model_runs;
    out->committed_steps = counters.committed_steps;
    out->rolled_back_steps = counters.rolled_back_steps;
    out->step_ns = counters.step_ns;
    out->executor_ns = counters.executor_ns;
    out->total_blocks = core.cache().total_blocks();
    out->free_blocks = core.cache().free_blocks();
    out->resident_requests = core.scheduler().residents().size();
    out->waiting_requests = core.scheduler().waiting().size();
    out->bound_requests = core.bound_request_count();
    out->retained_events = core.retained_event_count();
    out->fixed_state_direct_steps = counters.fixed_state_direct_steps;
    out->fixed_state_fallback_steps = counters.fixed_state_fallback_steps;
    out->device_sampled_rows = counters.device_sampled_rows;
    out->host_read_logits_rows = counters.host_read_logits_rows;
    out->preemptions = counters.preemptions;
    out->recomputed_tokens = counters.recomputed_tokens;
  });
}

OgaResult* OGA_API_CALL OgaExtRequestGetFixedStateSlot(const OgaRequest* request, OgaExtFixedStateSlot* out) {
  return Guard([&] {
    RequireNotNull(request, "request must not be null.");
    RequireNotNull(out, "out must not be null.");
    *out = OgaExtFixedStateSlot{};
    out->slot = -1;
    const oga::Request& core = CoreOf(request);
    if (core.closed() || core.engine() == nullptr || core.fixed_slot < 0) return;
    const oga::Engine& engine = *core.engine();
    engine.CheckOwnerThread();
    const oga::FixedStatePool* pool = engine.cache().fixed_state();
    const oga::FixedStateSlot& slot = pool->slots()[static_cast<size_t>(core.fixed_slot)];
    out->slot = core.fixed_slot;
    out->active_bank = slot.active_bank;
    out->allocation_generation = slot.allocation_generation;
    out->state_generation = slot.state_generation;
    out->committed_tokens = slot.committed_tokens;
  });
}

OgaResult* OGA_API_CALL OgaExtRequestGetFixedStateRow(const OgaRequest* request, size_t tensor, const void** data,
                                                      size_t* size) {
  return Guard([&] {
    RequireNotNull(request, "request must not be null.");
    RequireNotNull(data, "data must not be null.");
    RequireNotNull(size, "size must not be null.");
    const oga::Request& core = CoreOf(request);
    if (core.closed() || core.engine() == nullptr) throw ApiError(oga::kClosedRequestMessage);
    const oga::Engine& engine = *core.engine();
    engine.CheckOwnerThread();
    const oga::FixedStatePool* pool = engine.cache().fixed_state();
    if (pool == nullptr) throw ApiError("This engine's model has no fixed decoder state.");
    if (!pool->host_memory()) throw ApiError("The request's fixed state lives in device memory, which this function cannot read.");
    if (tensor >= pool->tensor_count()) {
      throw ApiError("Fixed state tensor " + std::to_string(tensor) + " is out of range [0, " +
                     std::to_string(pool->tensor_count()) + ").");
    }
    if (core.fixed_slot < 0) throw ApiError("The request owns no committed fixed state.");
    *data = pool->ActiveRow(tensor, core.fixed_slot);
    *size = pool->row_bytes(tensor);
  });
}

OgaResult* OGA_API_CALL OgaExtEngineSetFixedStateFallbackOnly(OgaEngine* engine, int32_t fallback_only) {
  return Guard([&] {
    RequireNotNull(engine, "engine must not be null.");
    oga::Engine& core = EngineOf(engine);
    core.CheckOwnerThread();
    core.SetFixedStateFallbackOnly(fallback_only != 0);
  });
}

OgaResult* OGA_API_CALL OgaExtEngineGetLastStepInputs(const OgaEngine* engine, OgaExtStepInputs* out) {
  return Guard([&] {
    RequireNotNull(engine, "engine must not be null.");
    RequireNotNull(out, "out must not be null.");
    EngineOf(engine).CheckOwnerThread();
    *out = EngineOf(engine).last_step_inputs();
  });
}

OgaResult* OGA_API_CALL OgaExtRequestSetLastTurnIdForTesting(OgaRequest* request, uint64_t turn_id) {
  return Guard([&] {
    RequireNotNull(request, "request must not be null.");
    oga::Request& core = CoreOf(request);
    if (core.closed()) throw ApiError(oga::kClosedRequestMessage);
    EngineOf(core).SetLastTurnIdForTesting(core, turn_id);
  });
}

}  // extern "C"
