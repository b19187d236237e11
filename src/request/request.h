// One engine request: a single sequence that lives across turns.
//
// Length counters (seed: "The request length counters"):
//   tokens.size()  -- the logical sequence: prompts, generated tokens, continuation input
//   processed      -- tokens already in the committed KV cache
//   unprocessed    -- [processed, tokens.size()): the next model input
// A sampled token enters `tokens` at commit, before it is in the cache; it is the next decode's input.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "sampling/guidance.h"
#include "config/model_config.h"
#include "base/random_stream.h"
#include "sampling/stop_string_matcher.h"
#include "oga/oga.h"
#include "request/turn_options.h"

namespace oga {

class Engine;
struct GeneratorRow;
struct StepRequest;

enum class RequestStatus : uint8_t {
  Unassigned,    // created, no turn yet
  Assigned,      // a turn is queued (waiting for admission or for its prefill to finish)
  Active,        // generating: one unprocessed token, the last sampled one
  TurnComplete,  // the turn ended; resident requests keep their cache
  Closed,        // terminal
};

class Request : public std::enable_shared_from_this<Request> {
 public:
  Request(Engine* engine, uint64_t serial, uint64_t max_session_tokens, const SearchConfig& search)
      : serial(serial), max_session_tokens(max_session_tokens), search(search), engine_(engine) {}

  size_t unprocessed() const { return tokens.size() - processed; }
  // A turn is queued or generating (Assigned or Active): schedulable work, a preemption candidate.
  bool executable() const { return status == RequestStatus::Assigned || status == RequestStatus::Active; }
  // Whether a step may give it a row now: an executable turn with input left, not paused by the
  // Generator that paces it (no token allowance left and no logits asked for).
  bool schedulable() const {
    return executable() && unprocessed() > 0 && (!paced || allowance > 0 || hold_logits || logits_held);
  }
  // Its model state (paged blocks, or a row of the static batch) is resident.
  bool resident() const { return cache_slot >= 0 || static_row >= 0; }
  bool closed() const { return status == RequestStatus::Closed; }
  Engine* engine() const { return engine_; }
  // Engine teardown and close detach the request from its engine.
  void Detach() { engine_ = nullptr; }

  const uint64_t serial;  // engine-unique identity for scheduler and cache bookkeeping
  const uint64_t max_session_tokens;
  const SearchConfig search;  // request-level defaults for turn policies

  RequestStatus status = RequestStatus::Unassigned;
  std::vector<int32_t> tokens;
  size_t processed = 0;

  uint64_t turn_id = 0;  // current turn; 0 = none yet
  // Where each retained turn began (its id, the sequence length before its input): rewind targets.
  std::vector<std::pair<uint64_t, size_t>> turn_starts;
  uint64_t turn_prompt_tokens = 0;
  uint64_t turn_generated_tokens = 0;
  uint64_t turn_cached_tokens = 0;  // prompt tokens this turn adopted from the prefix cache
  OgaFinishReason finish_reason = OgaFinishReason_None;
  TurnPolicy policy;
  RandomStream stream;  // advanced only by committed sampling steps
  // This turn's stop strings and grammar (docs/onnxruntime-genai-0.18-dynamic-engine.md, "Stop strings
  // and guidance"; seed: "Constrained decoding and tool calling"); both advance only at commit and are
  // released when the turn ends.
  StopStringMatcher stop;
  std::unique_ptr<GuidanceCursor> guidance;
  // The caller's pending speculative proposal for its next decode (seed: "Caller-supplied speculative
  // drafts"): consumed by a committed decode, kept by a rollback, discarded when the turn ends.
  std::vector<int32_t> draft_tokens;

  // Scheduler and cache membership.
  bool waiting = false;          // in the scheduler's admission queue
  int32_t cache_slot = -1;       // dynamic: index of the block table it owns; -1 = not resident
  int32_t static_row = -1;       // static: its row in the resident batch; -1 = not resident
  int32_t fixed_slot = -1;       // hybrid models: its committed fixed-state slot; -1 = none
  uint32_t retained_events = 0;  // undelivered events in the engine's queue
  // Preempted mid-turn: its KV cache was released and the prefill of its committed tokens is being
  // redone; cleared by the step that samples again. The turn's usage counts do not change meanwhile.
  bool recomputing = false;
  // Tokens its released cache had held (running or turn-complete victims): prefilling them again is
  // counted as recompute; 0 once they are back in the cache.
  size_t recompute_until = 0;

  // Generator rows (generator.h): a paced request produces at most `allowance` more tokens (one
  // per Generator::GenerateNextToken), so a row never runs ahead of its caller. With `hold_logits`
  // its next sampling step keeps the logits row in `held_logits` (`logits_held`) instead of
  // selecting a token; Engine::SelectHeldToken selects from them later (get_logits / set_logits).
  bool paced = false;
  uint32_t allowance = 0;
  bool hold_logits = false;
  bool logits_held = false;
  std::vector<float> held_logits;  // vocab_size floats once logits were held
  int32_t eos_token = -1;          // the EOS id that ended the last turn (Eos), else -1
  GeneratorRow* generator_row = nullptr;  // the Generator row this request serves, if any
  StepRequest* step_request = nullptr;    // the step-API request it runs (step_requests.h), if any

  // Public handle bookkeeping: the one external handle (nullptr once the caller released it).
  std::atomic<OgaRequest*> handle{nullptr};
  std::atomic<bool> abandoned{false};

 private:
  Engine* engine_;  // owner-thread access only; nullptr once closed or the engine is gone
};

}  // namespace oga

// C handle: the caller's one external reference. A request of the step API (OgaCreateRequest)
// has `step` instead of `request` (its engine request is the StepRequest's, created when an
// engine admits it).
struct OgaRequest {
  std::shared_ptr<oga::Request> request;
  std::shared_ptr<oga::StepRequest> step;
  std::weak_ptr<oga::Engine> engine;  // for abandonment from any thread
  std::atomic<void*> user_data{nullptr};
};
