// Generator: onnxruntime-genai 0.18's token-by-token loop (OgaGenerator) on the engine core.
//
// A Generator of batch_size B has B rows, each one engine Request on an engine of its own (the
// Generator's private engine, sized for B rows and max_length). A row's `sequence` is what
// get_sequence shows, in 0.18's shape: its prompt with any padding, the generated tokens, then,
// while other rows still generate, the EOS that ended it and a pad token for every later call (the
// call that ends the last row appends nothing). The request holds only what the model consumes: a
// batched row's trailing pad tokens are not model input (0.18 masks them), and EOS never is (0.18
// continues after it as if it had not been selected). Tokens the request has not been given yet
// wait in `pending` and begin its next turn.
//
// Every GenerateNextToken gives each unfinished row exactly one token: rows are paced
// (Engine::AllowTokens), so a row that got its token waits while others catch up (a longer
// prompt's chunked prefill, rows the cache could not hold at once). The model runs when a token is
// needed: append_tokens only queues the prompt, and get_logits / set_logits run the pending input
// and hold the logits (Engine::HoldLogits) for GenerateNextToken to select from.
//
// Thread safety: as in 0.18, calls may come from any thread but not concurrently, except
// SetRuntimeOption("terminate_session", ...) and IsSessionTerminated, which may be called while
// another thread generates. Calls that change the Generator hold its lock (a second caller waits);
// the readers (IsDone, sequences, next tokens) do not. The private engine adopts the calling
// thread as its owner.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/model.h"
#include "config/model_config.h"

namespace oga {

class Generator;
class GeneratorHost;

// What a Generator is created with (OgaGeneratorParams).
struct GeneratorSettings {
  SearchConfig search;
  std::string guidance_type;  // empty = no guidance
  std::string guidance_data;
};

struct GeneratorRow {
  Generator* owner = nullptr;
  std::shared_ptr<Request> request;  // null before the first append and after rewind_to(0)
  std::vector<int32_t> sequence;
  std::vector<int32_t> pending;      // model input the request has not been given yet
  bool ended = false;                // EOS: pads from the next call on
  bool awaiting_token = false;       // the current GenerateNextToken waits for this row's token
  bool awaiting_logits = false;      // the current logits request waits for this row's logits
  bool pad_pending = false;          // ended before the current GenerateNextToken: gets a pad
  bool eos_pending = false;          // its EOS came in the current GenerateNextToken
};

class Generator {
 public:
  // Validates the settings (0.18's checks and texts; beam search is refused) and creates the engine.
  Generator(std::shared_ptr<Model> model, const GeneratorSettings& settings);
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  // `count` tokens, batch_size rows of count / batch_size each (a right-padded batch).
  void AppendTokens(const int32_t* tokens, size_t count);
  // One sequence per row, right-padded with the pad token to the longest.
  void AppendTokenSequences(const std::vector<std::vector<int32_t>>& sequences);
  void GenerateNextToken();
  bool IsDone();
  void RewindTo(size_t length);
  // The next-token logits of every row, [rows * vocab_size] (rows that ended: zeros); computes
  // them first when the model has not run the rows' pending tokens yet. The storage is the
  // Generator's and stays valid until the next call that changes it.
  const std::vector<float>& GetLogits();
  void SetLogits(const float* logits, size_t count);
  void SetRuntimeOption(const std::string& key, const std::string& value);

  bool terminated() const { return terminated_.load(std::memory_order_acquire); }
  size_t row_count() const { return rows_.size(); }
  size_t vocab_size() const { return vocab_size_; }
  // Sequence length (every row has the same).
  size_t token_count() const { return rows_.front().sequence.size(); }
  const std::vector<int32_t>& sequence(size_t row) const { return rows_[row].sequence; }
  // The last token of every row (0 where a row is empty).
  const std::vector<int32_t>& next_tokens() const { return next_tokens_; }

 private:
  friend class GeneratorHost;  // delivers events and held logits to the rows (shared engine)

  // Runs engine work where the engine's owner thread is: here (own engine) or on the host's.
  template <typename Work>
  void OnEngine(Work&& work);
  // The engine side of the public calls (run through OnEngine).
  void AppendOnEngine(const int32_t* tokens, size_t count);
  bool GrantTokens();  // false when every row had ended: nothing to generate
  void RewindOnEngine(size_t length);
  void RequestLogits();
  bool Awaiting() const;
  // Rows whose logits a step held stop waiting for them.
  void RefreshHeldLogits();
  void CheckNotTerminated() const;
  void CheckHealthy() const;
  // Finishes what an interrupted call left waiting (an interruption or a terminate_session stops a
  // call between steps; the next call completes its rows before doing anything else).
  void CompleteInterrupted();
  // Creates the row's request if it has none.
  void EnsureRequest(GeneratorRow& row);
  // Ends a running turn (the row is about to get new input or be truncated).
  void StopTurn(GeneratorRow& row);
  // Begins the row's next turn with its pending input.
  void BeginPendingTurn(GeneratorRow& row);
  // After RewindTo: appends the first discarded token again (0.18's next token after a rewind).
  void RestoreRewoundToken();
  // Makes every unfinished row hold its next-token logits (RequestLogits, then Drive).
  void ComputeLogits();
  // Until no row awaits a token or logits: steps the own engine here, dispatching its events, or
  // waits while the host's thread steps the shared one.
  void Drive();
  void Dispatch(const EngineEvent& event);
  // The end of a GenerateNextToken: rows that had ended get their pad.
  void FinishGeneration();
  void RefreshNextTokens();
  void CloseRows();

  std::shared_ptr<Model> model_;
  const GeneratorSettings settings_;
  const size_t max_length_;
  const size_t vocab_size_;
  const int32_t pad_token_id_;
  SearchConfig request_search_;  // what each row's request is created with
  std::shared_ptr<GeneratorHost> host_;  // engine.shared_generators: the shared engine's host
  std::shared_ptr<Engine> own_engine_;   // otherwise: the Generator's own engine
  Engine* engine_ = nullptr;             // whichever of the two
  std::unique_ptr<OgaEngineEventBuffer> buffer_;  // own engine only
  std::vector<GeneratorRow> rows_;
  std::vector<int32_t> next_tokens_;
  std::vector<float> logits_;
  bool appended_ = false;      // batch_size > 1: append_tokens was called (0.18 allows it once)
  bool generation_open_ = false;  // a GenerateNextToken granted its tokens and has not finished
  bool logits_valid_ = false;  // 0.18's "logits computed": after append_tokens or get_logits
  std::string row_failure_;    // a row's turn failed (guidance); reported by the waiting call
  int32_t restore_token_ = -1;  // RewindTo's first discarded token, until the model next runs
  std::mutex mutex_;           // one call at a time
  std::atomic<bool> terminated_{false};
};

}  // namespace oga

struct OgaGenerator {
  std::unique_ptr<oga::Generator> generator;
};
