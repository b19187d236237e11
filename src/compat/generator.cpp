#include "compat/generator.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include "base/errors.h"
#include "config/search_options.h"
#include "request/events.h"
#include "compat/generator_host.h"
#include "base/mix64.h"
#include "request/turn_options.h"

namespace oga {
namespace {

constexpr const char* kTerminatedMessage = "Session in Terminated state, exiting!";
// Runs in a row that neither commit a step nor deliver an event before the Generator gives up: the
// engine reports CapacityBlocked or Retryable each time, so its rows cannot all be served.
constexpr size_t kMaxIdleRuns = 8;
// 0.18's bounds for batch_size.
constexpr int64_t kMaxBatchSize = 32;

bool Greedy(const SearchConfig& search) { return !search.do_sample || search.top_k == 1 || search.temperature == 0; }

// The sampling checks 0.18 makes when it creates a Generator (only for sampled generation); "" if
// none fails.
std::string SamplingError(const SearchConfig& search, size_t vocab_size) {
  if (Greedy(search)) return std::string();
  if (!(search.top_p >= 0.0 && search.top_p <= 1.0)) return "top_p must be between 0.0 and 1.0";
  if (search.top_k < 0) return "top_k must be 0 or greater";
  if (static_cast<uint64_t>(search.top_k) > vocab_size) {
    return "top_k (" + std::to_string(search.top_k) + ") must be less than or equal to vocab_size (" +
           std::to_string(vocab_size) + ")";
  }
  return std::string();
}

size_t RowCount(const SearchConfig& search) {
  if (search.batch_size < 1 || search.batch_size > kMaxBatchSize) {
    throw ApiError("batch_size (" + std::to_string(search.batch_size) + ") must be in [1, " +
                   std::to_string(kMaxBatchSize) + "]");
  }
  if (search.num_beams != 1) {
    throw ApiError("num_beams (" + std::to_string(search.num_beams) +
                   "): beam search is not supported by oga's Generator. Each sequence is one engine request with "
                   "its own KV cache, and the engine never reorders or forks caches between requests, which beam "
                   "search needs at every step. Use num_beams=1 (greedy or sampled search).");
  }
  if (search.num_return_sequences != 1) {
    throw ApiError("num_return_sequences (" + std::to_string(search.num_return_sequences) + ") must be in [1, 1]");
  }
  return static_cast<size_t>(search.batch_size);
}

}  // namespace

Generator::Generator(std::shared_ptr<Model> model, const GeneratorSettings& settings)
    : model_(std::move(model)),
      settings_(settings),
      max_length_(CheckedMaxLength(settings.search, model_->config().context_length)),
      vocab_size_(static_cast<size_t>(model_->config().vocab_size)),
      pad_token_id_(model_->config().pad_token_id),
      rows_(RowCount(settings.search)) {
  const SearchConfig& search = settings_.search;
  const std::string sampling_error = SamplingError(search, vocab_size_);
  if (!sampling_error.empty()) throw ApiError(sampling_error);
  if (!model_->config().dynamic_batching && search.chunk_size > 0) {
    throw ApiError("search.chunk_size requires dynamic batching; the static batch scheduler cannot chunk a prefill.");
  }
  // Each row's request: the generation settings, with the parts the Generator handles itself
  // (min_length per turn, one beam) cleared, and a greedy search's unused sampling values made
  // neutral (0.18 does not look at them).
  request_search_ = search;
  request_search_.min_length = 0;
  request_search_.num_beams = 1;
  if (Greedy(search)) {
    request_search_.do_sample = false;
    request_search_.temperature = 1.0;
    request_search_.top_p = 1.0;
    request_search_.top_k = 0;
  }
  for (GeneratorRow& row : rows_) row.owner = this;
  if (model_->config().shared_generators) {
    // engine.shared_generators: the rows are requests of the model's one shared engine.
    host_ = GeneratorHost::Of(model_);
    engine_ = &host_->engine();
  } else {
    // The Generator's own engine holds what it can use and no more, as 0.18 allocates per
    // Generator: a block table's worth of KV blocks per row, one selection thread per row at most.
    EngineSizing sizing;
    sizing.min_batch_size = rows_.size();
    sizing.static_max_length = max_length_;
    sizing.selection_participants = rows_.size();
    sizing.static_fixed_state = true;  // as 0.18's Generator, which runs LFM2's CPU build
    if (const auto& batching = model_->config().dynamic_batching) {
      const size_t block_size = static_cast<size_t>(std::max<int64_t>(batching->block_size, 1));
      sizing.max_blocks = rows_.size() * ((max_length_ + block_size - 1) / block_size);
    }
    own_engine_ = Engine::Create(model_, sizing);
    engine_ = own_engine_.get();
    // One event per row and step, plus engine-level events: a Run never retains events.
    buffer_ = std::make_unique<OgaEngineEventBuffer>(engine_->id(), rows_.size() * 2 + 8);
  }
  if (!engine_->static_batching() && max_length_ > engine_->max_request_length()) {
    throw ApiError("max_length (" + std::to_string(max_length_) +
                   ") exceeds the longest sequence the engine's KV cache holds (max_request_length " +
                   std::to_string(engine_->max_request_length()) +
                   " = min(context_length, num_blocks * block_size + 1)). Lower max_length or raise "
                   "engine.dynamic_batching.num_blocks.");
  }
  for (GeneratorRow& row : rows_) {
    row.sequence.reserve(max_length_);
    row.pending.reserve(max_length_);
  }
  next_tokens_.assign(rows_.size(), 0);
  logits_.assign(rows_.size() * vocab_size_, 0.0f);
  if (host_) host_->Attach(this);
}

Generator::~Generator() {
  if (host_) {
    // The rows leave the shared engine (their caches go back to it) before the Generator goes.
    try {
      host_->Call([this] { CloseRows(); });
    } catch (...) {
      // The engine is shutting down or failed: its teardown closes the requests.
    }
    host_->Detach(this);
    if (host_->IsOwnerThread()) {
      // Released from inside a step (an executor callback collected the Generator): the host must
      // not join its own thread, so another thread drops this reference.
      std::thread([host = std::move(host_)]() mutable { host.reset(); }).detach();
    }
  } else if (own_engine_) {
    own_engine_->Teardown();
  }
}

template <typename Work>
void Generator::OnEngine(Work&& work) {
  if (host_) {
    host_->Call(work);
  } else {
    engine_->AdoptOwnerThread();
    work();
  }
}

void Generator::CheckNotTerminated() const {
  if (terminated()) throw ApiError(kTerminatedMessage);
}

void Generator::CheckHealthy() const { engine_->ThrowIfUnhealthy(); }

void Generator::EnsureRequest(GeneratorRow& row) {
  if (row.request) return;
  SearchConfig search = request_search_;
  if (search.random_seed) {
    // Row 0 draws like an engine request with the same seed; the others get seeds of their own.
    const size_t index = static_cast<size_t>(&row - rows_.data());
    if (index > 0) search.random_seed = Mix64(*search.random_seed + index);
  }
  std::shared_ptr<Request> request = engine_->CreateRequest(nullptr, search);
  engine_->AllowTokens(*request, 0);
  request->generator_row = &row;
  row.request = std::move(request);
}

void Generator::StopTurn(GeneratorRow& row) {
  if (!row.request || !row.request->executable()) return;
  engine_->CancelTurn(*row.request, row.request->turn_id);
  // Deliver the cancellation (and nothing else: the queue holds only retained events, so no step runs).
  if (host_) {
    host_->DeliverRetained();
    return;
  }
  while (engine_->retained_event_count() > 0) {
    engine_->Run(*buffer_);
    for (size_t i = 0; i < buffer_->count; ++i) Dispatch(buffer_->slots[i]);
  }
}

void Generator::BeginPendingTurn(GeneratorRow& row) {
  TurnOptionValues values;
  const size_t length = token_count();
  const int64_t min_length = settings_.search.min_length;
  if (min_length > static_cast<int64_t>(length)) {
    // 0.18 masks EOS while the sequence is shorter than min_length.
    values.min_generated_tokens = std::min<uint64_t>(static_cast<uint64_t>(min_length) - length, max_length_ - length);
  }
  values.guidance_type = settings_.guidance_type;
  values.guidance_data = settings_.guidance_data;
  engine_->BeginTurnWith(*row.request, &values, row.pending.data(), row.pending.size());
  row.pending.clear();
}

void Generator::AppendTokens(const int32_t* tokens, size_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  CheckNotTerminated();
  CompleteInterrupted();
  OnEngine([&] { AppendOnEngine(tokens, count); });
}

void Generator::AppendOnEngine(const int32_t* tokens, size_t count) {
  CheckHealthy();
  if (count == 0) throw ApiError("input_ids is empty");
  const size_t rows = rows_.size();
  if (count % rows != 0) {
    throw ApiError("input_ids holds " + std::to_string(count) + " token(s), which is not a positive multiple of batch_size " +
                   std::to_string(rows) + ". The buffer must be a padded [batch_size, sequence_length] block.");
  }
  if (rows > 1 && appended_) {
    throw ApiError(
        "AppendTokens can only be called once for batch_size > 1. To call AppendTokens again, use RewindToLength(0)");
  }
  const size_t length = count / rows;
  if (length + token_count() > max_length_) {
    throw ApiError("input_ids size (" + std::to_string(count) + ") + current sequence length (" +
                   std::to_string(token_count()) + ") exceeds max length (" + std::to_string(max_length_) + ")");
  }
  for (size_t i = 0; i < count; ++i) {
    if (tokens[i] < 0 || static_cast<size_t>(tokens[i]) >= vocab_size_) {
      throw ApiError("input_ids[" + std::to_string(i) + "] (" + std::to_string(tokens[i]) +
                     ") is outside the model's vocabulary [0, " + std::to_string(vocab_size_) + ").");
    }
  }
  for (size_t r = 0; r < rows; ++r) {
    GeneratorRow& row = rows_[r];
    StopTurn(row);
    const int32_t* begin = tokens + r * length;
    const int32_t* end = begin + length;
    row.sequence.insert(row.sequence.end(), begin, end);
    // A batch is right-padded: the padding is part of the sequence but not model input (0.18
    // masks it). A row of nothing but padding keeps one token so that it has an input.
    const int32_t* input_end = end;
    if (rows > 1) {
      while (input_end - begin > 1 && input_end[-1] == pad_token_id_) --input_end;
    }
    row.pending.insert(row.pending.end(), begin, input_end);
    row.ended = false;
  }
  appended_ = true;
  logits_valid_ = true;
  restore_token_ = -1;
  RefreshNextTokens();
}

void Generator::AppendTokenSequences(const std::vector<std::vector<int32_t>>& sequences) {
  if (sequences.empty()) throw ApiError("input sequences are empty");
  if (sequences.size() != rows_.size()) throw ApiError("input sequences count does not match batch size");
  size_t longest = 0;
  for (const std::vector<int32_t>& sequence : sequences) longest = std::max(longest, sequence.size());
  if (longest == 0) throw ApiError("input_ids is empty");
  std::vector<int32_t> block(rows_.size() * longest, pad_token_id_);
  for (size_t r = 0; r < sequences.size(); ++r) {
    std::copy(sequences[r].begin(), sequences[r].end(), block.begin() + static_cast<std::ptrdiff_t>(r * longest));
  }
  AppendTokens(block.data(), block.size());
}

void Generator::GenerateNextToken() {
  std::lock_guard<std::mutex> lock(mutex_);
  CheckNotTerminated();
  if (generation_open_) {
    // The previous call was interrupted between steps: this call delivers its token.
    OnEngine([this] { CheckHealthy(); });
    Drive();
    FinishGeneration();
    return;
  }
  CompleteInterrupted();
  bool granted = false;
  OnEngine([&] { granted = GrantTokens(); });
  if (!granted) return;
  Drive();
  FinishGeneration();
}

bool Generator::GrantTokens() {
  CheckHealthy();
  if (token_count() == 0) {
    throw ApiError(
        "GenerateNextToken called with no prior state. Please call AppendTokens, SetLogits, or SetInputs before "
        "calling GenerateNextToken.");
  }
  RestoreRewoundToken();
  if (token_count() >= max_length_) {
    throw ApiError("GenerateNextToken called with sequence length already at max_length (" +
                   std::to_string(max_length_) + ")");
  }
  if (std::all_of(rows_.begin(), rows_.end(), [](const GeneratorRow& row) { return row.ended; })) return false;
  // Fallible work first (turns begin with their pending input), then the grants.
  for (GeneratorRow& row : rows_) {
    if (row.ended) continue;
    EnsureRequest(row);
    if (!row.request->logits_held && !row.pending.empty()) BeginPendingTurn(row);
  }
  // Held logits (get_logits / set_logits) are selected below, row by row: every row must be
  // selectable first, or a failing row would leave the others' tokens published without it.
  for (GeneratorRow& row : rows_) {
    if (!row.ended && row.request->logits_held) engine_->CheckHeldTokenSelectable(*row.request);
  }
  generation_open_ = true;
  for (GeneratorRow& row : rows_) {
    if (row.ended) {
      row.pad_pending = true;
      continue;
    }
    row.awaiting_token = true;
    if (row.request->logits_held) {
      engine_->SelectHeldToken(*row.request);  // its event is delivered by Drive
    } else {
      engine_->AllowTokens(*row.request, 1);
    }
  }
  return true;
}

void Generator::FinishGeneration() {
  // 0.18 appends a row's EOS, and a pad for every later call, only while another row still
  // generates: the call that ends the last row appends nothing (its EOS is not context either when
  // the Generator continues with append_tokens). next_tokens still shows what each row selected.
  const bool all_ended = std::all_of(rows_.begin(), rows_.end(), [](const GeneratorRow& row) { return row.ended; });
  for (size_t r = 0; r < rows_.size(); ++r) {
    GeneratorRow& row = rows_[r];
    if (row.pad_pending) {
      if (!all_ended) row.sequence.push_back(pad_token_id_);
      next_tokens_[r] = pad_token_id_;
    } else if (row.eos_pending) {
      next_tokens_[r] = row.sequence.back();
      if (all_ended) row.sequence.pop_back();
    } else {
      next_tokens_[r] = row.sequence.empty() ? 0 : row.sequence.back();
    }
    row.pad_pending = false;
    row.eos_pending = false;
  }
  generation_open_ = false;
  logits_valid_ = false;
}

void Generator::CompleteInterrupted() {
  if (!Awaiting() && !generation_open_) return;
  Drive();
  if (generation_open_) FinishGeneration();
}

bool Generator::IsDone() {
  // Reads only (no lock): a binding may ask while holding its own interpreter lock.
  CheckNotTerminated();
  const size_t length = token_count();
  if (length == 0) return false;
  if (length >= max_length_) return true;
  return std::all_of(rows_.begin(), rows_.end(), [](const GeneratorRow& row) { return row.ended; });
}

void Generator::CloseRows() {
  for (GeneratorRow& row : rows_) {
    if (row.request) {
      engine_->Close(*row.request);
      row.request->generator_row = nullptr;
      row.request.reset();
    }
    row.sequence.clear();
    row.pending.clear();
    row.ended = false;
    row.awaiting_token = false;
    row.awaiting_logits = false;
    row.pad_pending = false;
    row.eos_pending = false;
  }
}

void Generator::RewindTo(size_t length) {
  std::lock_guard<std::mutex> lock(mutex_);
  CompleteInterrupted();
  OnEngine([&] { RewindOnEngine(length); });
}

void Generator::RewindOnEngine(size_t length) {
  CheckHealthy();
  if (rows_.size() > 1 && length != 0) {
    throw ApiError("RewindToLength must be called with new_length=0 when batch_size > 1");
  }
  if (length > token_count()) throw ApiError("Cannot rewind to a length greater than the current sequence length");
  if (engine_->static_fixed_state() && length != 0 && length != token_count()) {
    // A row's convolution state holds no earlier length to go back to (0.18's text).
    throw ApiError("RewindTo is currently not supported for " + model_->config().model_type + ".");
  }
  logits_valid_ = false;
  if (length == 0) {
    CloseRows();
    restore_token_ = -1;
    appended_ = false;
    RefreshNextTokens();
    return;
  }
  if (length == token_count()) return;
  // 0.18 keeps the first discarded token as the next token: the next call that runs the model
  // (GenerateNextToken, GetLogits) appends it again before anything else (RestoreRewoundToken).
  GeneratorRow& row = rows_.front();
  restore_token_ = row.sequence[length];
  // One row (batch_size 1): its sequence is the request's tokens followed by its pending input. The
  // request keeps the first `keep` tokens; the rest of the kept sequence becomes the next turn's
  // input, at least one token, so that the model runs up to the new end.
  StopTurn(row);
  size_t keep = 0;
  if (row.request && !row.request->tokens.empty()) {
    keep = std::min(length, row.request->tokens.size()) - 1;
    engine_->TruncateRequest(*row.request, keep);
  }
  row.sequence.resize(length);
  row.pending.assign(row.sequence.begin() + static_cast<std::ptrdiff_t>(keep), row.sequence.end());
  row.ended = false;
  next_tokens_[0] = restore_token_;
}

void Generator::RestoreRewoundToken() {
  if (restore_token_ < 0) return;
  if (token_count() >= max_length_) {
    throw ApiError("GenerateNextToken called with sequence length already at max_length (" +
                   std::to_string(max_length_) + ")");
  }
  GeneratorRow& row = rows_.front();
  row.sequence.push_back(restore_token_);
  row.pending.push_back(restore_token_);
  restore_token_ = -1;
}

void Generator::ComputeLogits() {
  OnEngine([this] { RequestLogits(); });
  Drive();
}

void Generator::RequestLogits() {
  CheckHealthy();
  if (token_count() == 0) {
    throw ApiError("No logits to compute: call AppendTokens before GetLogits or SetLogits.");
  }
  RestoreRewoundToken();
  if (token_count() >= max_length_) {
    throw ApiError("The sequences are at max_length (" + std::to_string(max_length_) +
                   "): there are no next-token logits to compute.");
  }
  for (GeneratorRow& row : rows_) {
    if (row.ended) continue;
    EnsureRequest(row);
    if (row.request->logits_held) continue;
    if (!row.pending.empty()) BeginPendingTurn(row);
  }
  for (GeneratorRow& row : rows_) {
    if (row.ended || row.request->logits_held) continue;
    engine_->HoldLogits(*row.request);
    row.awaiting_logits = true;
  }
}

const std::vector<float>& Generator::GetLogits() {
  std::lock_guard<std::mutex> lock(mutex_);
  CompleteInterrupted();
  ComputeLogits();
  for (size_t r = 0; r < rows_.size(); ++r) {
    float* out = logits_.data() + r * vocab_size_;
    const GeneratorRow& row = rows_[r];
    if (row.ended) {
      std::fill(out, out + vocab_size_, 0.0f);
    } else {
      std::memcpy(out, row.request->held_logits.data(), vocab_size_ * sizeof(float));
    }
  }
  logits_valid_ = true;
  return logits_;
}

void Generator::SetLogits(const float* logits, size_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  CompleteInterrupted();
  if (!logits_valid_) {
    throw ApiError(
        "logits are not computed yet. Please call GenerateNextToken or AppendTokens before calling SetLogits.");
  }
  const size_t expected = rows_.size() * vocab_size_;
  if (count != expected) {
    throw ApiError("Generator::SetLogits passed an array of size " + std::to_string(count) + " but should be size " +
                   std::to_string(expected));
  }
  ComputeLogits();
  for (size_t r = 0; r < rows_.size(); ++r) {
    GeneratorRow& row = rows_[r];
    if (row.ended) continue;
    std::memcpy(row.request->held_logits.data(), logits + r * vocab_size_, vocab_size_ * sizeof(float));
  }
}

void Generator::SetRuntimeOption(const std::string& key, const std::string& value) {
  if (key != "terminate_session") {
    throw ApiError("Unknown runtime option \"" + key + "\": oga's Generator knows only terminate_session.");
  }
  if (value == "1") {
    terminated_.store(true, std::memory_order_release);
    if (host_) host_->Wake();  // a call waiting for its tokens returns
  } else if (value == "0") {
    terminated_.store(false, std::memory_order_release);
  } else {
    throw ApiError("terminate_session key value unexpected: " + value);
  }
}

bool Generator::Awaiting() const {
  return std::any_of(rows_.begin(), rows_.end(),
                     [](const GeneratorRow& row) { return row.awaiting_token || row.awaiting_logits; });
}

void Generator::RefreshHeldLogits() {
  for (GeneratorRow& row : rows_) {
    if (row.awaiting_logits && row.request && row.request->logits_held) row.awaiting_logits = false;
  }
}

void Generator::Drive() {
  if (host_) {
    // The host's owner thread steps the shared engine and delivers this Generator's events.
    host_->WaitFor([this] { return terminated() || !row_failure_.empty() || !Awaiting(); });
    CheckNotTerminated();
    if (!row_failure_.empty()) {
      std::string failure = std::move(row_failure_);
      row_failure_.clear();
      throw ApiError(failure);
    }
    return;
  }
  // The Generator's own engine: this thread steps it.
  engine_->AdoptOwnerThread();
  size_t idle_runs = 0;
  while (Awaiting()) {
    CheckNotTerminated();
    const uint64_t committed = engine_->counters().committed_steps;
    engine_->Run(*buffer_);
    if (engine_->last_run_interrupted()) throw InterruptedError("The Generator's step was interrupted.");
    bool progressed = engine_->counters().committed_steps != committed;
    bool blocked = false;
    for (size_t i = 0; i < buffer_->count; ++i) {
      const EngineEvent& event = buffer_->slots[i];
      if (event.request) {
        Dispatch(event);
        progressed = true;
      } else if (event.flags & OgaEngineEventFlag_Failed) {
        engine_->ThrowIfUnhealthy();
      } else if (event.flags & OgaEngineEventFlag_CapacityBlocked) {
        blocked = true;
      }
    }
    RefreshHeldLogits();
    engine_->ThrowIfUnhealthy();
    if (!row_failure_.empty()) {
      std::string failure = std::move(row_failure_);
      row_failure_.clear();
      throw ApiError(failure);
    }
    if (progressed) {
      idle_runs = 0;
    } else if (++idle_runs >= kMaxIdleRuns) {
      if (blocked) {
        throw ApiError("The Generator's " + std::to_string(rows_.size()) +
                       " sequences do not fit the model's KV cache together (engine.dynamic_batching.num_blocks). "
                       "Lower batch_size or max_length, or raise num_blocks.");
      }
      throw ApiError("The Generator's engine makes no progress: every step it ran was rolled back.");
    }
  }
}

void Generator::Dispatch(const EngineEvent& event) {
  GeneratorRow* row = event.request->generator_row;
  if (row == nullptr) return;
  if (event.flags & OgaEngineEventFlag_Token) {
    row->sequence.push_back(event.token);
    row->awaiting_token = false;
  }
  if ((event.flags & OgaEngineEventFlag_TurnFinished) == 0) return;
  switch (event.finish_reason) {
    case OgaFinishReason_Eos: {
      row->sequence.push_back(event.request->eos_token);  // FinishGeneration may take it back
      row->eos_pending = true;
      row->ended = true;
      row->awaiting_token = false;
      break;
    }
    case OgaFinishReason_Failed:
      row->awaiting_token = false;
      row->awaiting_logits = false;
      if (row_failure_.empty()) {
        row_failure_ = "Sequence " + std::to_string(row - rows_.data()) +
                       " can no longer be served: its guidance grammar allows no further token, or it does not fit "
                       "the KV cache.";
      }
      break;
    default:
      // Cancelled (the Generator ended the turn itself) and the length limits, which a token event
      // carries with its token.
      row->awaiting_token = false;
      break;
  }
}

void Generator::RefreshNextTokens() {
  for (size_t r = 0; r < rows_.size(); ++r) {
    next_tokens_[r] = rows_[r].sequence.empty() ? 0 : rows_[r].sequence.back();
  }
}

}  // namespace oga
