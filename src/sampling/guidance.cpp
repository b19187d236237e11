#include "sampling/guidance.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "base/errors.h"

namespace oga {

// The parts of llguidance's C API (llguidance.h, version 1.x) oga uses. Layouts follow the header;
// LlgConstraintInit is filled by the library's own defaults into a padded buffer, so a library
// with a longer struct still works.
namespace {

typedef size_t (*LlgTokenizeFn)(const void*, const uint8_t*, size_t, uint32_t*, size_t);

struct LlgTokenizerInitV2 {
  size_t struct_size;
  uint32_t vocab_size;
  uint32_t tok_eos;
  const uint32_t* token_lens;
  const uint8_t* token_bytes;
  const char* tokenizer_json;
  bool tokenize_assumes_string;
  LlgTokenizeFn tokenize_fn;
  bool use_approximate_greedy_tokenize_fn;
  const void* tokenize_user_data;
  const char* const* slices;
  const uint32_t* tok_eos_extra;
  uint32_t tok_eos_extra_count;
};

struct LlgParserLimits {
  size_t max_items_in_row;
  uint64_t initial_lexer_fuel;
  uint64_t step_lexer_fuel;
  size_t step_max_items;
  size_t max_lexer_states;
  size_t max_grammar_size;
  bool precompute_large_lexemes;
  bool verbose_errors;
};

struct LlgConstraintInit {
  const void* tokenizer;
  uint32_t log_buffer_level;
  uint32_t log_stderr_level;
  bool ff_tokens_ok;
  bool backtrack_ok;
  LlgParserLimits limits;
};

union ConstraintInitBuffer {
  LlgConstraintInit init;
  unsigned char padding[1024];
};

std::atomic<OgaExtTokenizeFunction> g_tokenize{nullptr};
// Set when the registered tokenizer returned OgaExtTokenize_Interrupted on this thread; the mask
// computation that ran it (on the same thread) then fails with InterruptedError.
thread_local bool t_tokenize_interrupted = false;
std::mutex g_library_mutex;
std::string g_library_path;  // guarded by g_library_mutex
const GuidanceApi* g_api = nullptr;

}  // namespace

struct GuidanceApi {
  void* (*new_tokenizer_v2)(const LlgTokenizerInitV2*, char*, size_t);
  void (*free_tokenizer)(void*);
  void (*constraint_init_set_defaults)(void*, const void*);
  void* (*new_matcher)(const void*, const char*, const char*);
  const char* (*matcher_get_error)(void*);
  size_t (*matcher_get_mask_byte_size)(const void*);
  int32_t (*matcher_compute_mask_into)(void*, uint32_t*, size_t);
  int32_t (*matcher_consume_token)(void*, uint32_t);
  void (*free_matcher)(void*);
  const char* (*get_version)();
};

namespace {

template <typename Fn>
void Resolve(void* library, const char* name, Fn& out, const std::string& path) {
  out = reinterpret_cast<Fn>(dlsym(library, name));
  if (out == nullptr) {
    throw ApiError("The llguidance library " + path + " does not export " + name +
                   "; oga needs llguidance 1.x (pip install 'llguidance>=1.9,<2').");
  }
}

// Loads the library on first use; later calls return the same table.
const GuidanceApi& LoadGuidanceApi() {
  std::lock_guard<std::mutex> lock(g_library_mutex);
  if (g_api != nullptr) return *g_api;
  std::string path = g_library_path;
  if (const char* variable = std::getenv("OGA_LLGUIDANCE_LIBRARY"); variable != nullptr && variable[0] != '\0') {
    path = variable;
  }
  if (path.empty()) {
    throw ApiError(
        "Guidance requires llguidance, which is not installed: pip install 'llguidance>=1.9,<2' (or oga[guidance]), "
        "or set OGA_LLGUIDANCE_LIBRARY to its shared library.");
  }
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* reason = dlerror();
    throw ApiError("Failed to load the llguidance library " + path + ": " + (reason != nullptr ? reason : "unknown error"));
  }
  auto* api = new GuidanceApi();
  try {
    Resolve(library, "llg_new_tokenizer_v2", api->new_tokenizer_v2, path);
    Resolve(library, "llg_free_tokenizer", api->free_tokenizer, path);
    Resolve(library, "llg_constraint_init_set_defaults", api->constraint_init_set_defaults, path);
    Resolve(library, "llg_new_matcher", api->new_matcher, path);
    Resolve(library, "llg_matcher_get_error", api->matcher_get_error, path);
    Resolve(library, "llg_matcher_get_mask_byte_size", api->matcher_get_mask_byte_size, path);
    Resolve(library, "llg_matcher_compute_mask_into", api->matcher_compute_mask_into, path);
    Resolve(library, "llg_matcher_consume_token", api->matcher_consume_token, path);
    Resolve(library, "llg_free_matcher", api->free_matcher, path);
    Resolve(library, "llg_get_version", api->get_version, path);
  } catch (...) {
    delete api;
    dlclose(library);
    throw;
  }
  const char* version = api->get_version();
  if (version == nullptr || std::strncmp(version, "llguidance@1.", 13) != 0) {
    const std::string found = version != nullptr ? version : "an unknown version";
    delete api;
    dlclose(library);
    throw ApiError("The llguidance library " + path + " is " + found + "; oga needs llguidance 1.x.");
  }
  g_api = api;  // kept loaded for the life of the process: matchers may outlive any one engine
  return *g_api;
}

// llguidance's messages can run over many lines of parser state; the first line is the reason.
std::string FirstLine(const char* message) {
  std::string text = message != nullptr ? message : "";
  const size_t end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

}  // namespace

void SetTokenizeFunction(OgaExtTokenizeFunction tokenize) { g_tokenize.store(tokenize); }

void SetGuidanceLibraryPath(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_library_mutex);
  g_library_path = path;
}

size_t GuidanceTokenizer::TokenizeContext::LongestMatch(const uint8_t* bytes, size_t count, uint32_t* tokens,
                                                       size_t capacity) const {
  size_t produced = 0;
  std::string piece;
  for (size_t at = 0; at < count;) {
    size_t length = std::min(longest, count - at);
    for (; length > 0; --length) {
      piece.assign(reinterpret_cast<const char*>(bytes + at), length);
      const auto found = ids.find(piece);
      if (found == ids.end()) continue;
      if (produced < capacity) tokens[produced] = found->second;
      ++produced;
      break;
    }
    if (length == 0) return produced;  // a byte no token spells: the rest cannot be tokenized
    at += length;
  }
  return produced;
}

size_t GuidanceTokenizer::TokenizeContext::Tokenize(const uint8_t* bytes, size_t count, uint32_t* tokens,
                                                   size_t capacity) const {
  try {
    {
      std::vector<uint32_t> got(count + 1);
      const size_t n = function(directory.c_str(), bytes, count, got.data(), got.size());
      if (n == OgaExtTokenize_Interrupted) t_tokenize_interrupted = true;
      if (n > 0 && n <= got.size()) {
        std::string spelled;
        for (size_t i = 0; i < n; ++i) {
          const int32_t token = static_cast<int32_t>(got[i]);
          if (got[i] >= table->size() || table->special(token)) break;
          spelled.append(table->bytes(token), table->length(token));
        }
        if (spelled.size() == count && std::memcmp(spelled.data(), bytes, count) == 0) {
          std::copy(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(std::min(n, capacity)), tokens);
          return n;
        }
      }
    }
    return LongestMatch(bytes, count, tokens, capacity);
  } catch (...) {
    return 0;  // out of memory inside a callback llguidance cannot unwind through
  }
}

GuidanceTokenizer::GuidanceTokenizer(std::shared_ptr<const TokenTable> shared_table, size_t vocab_size,
                                     const std::vector<int32_t>& eos_ids, const std::string& directory)
    : api_(&LoadGuidanceApi()), vocab_size_(vocab_size) {
  const TokenTable& table = *shared_table;
  if (vocab_size > UINT32_MAX || eos_ids.empty()) {
    throw ApiError("Guidance needs a vocabulary below 2^32 tokens and at least one EOS token id.");
  }
  // llguidance marks special tokens with a leading 0xFF byte, so no grammar can spell them as text;
  // ids without text (beyond the tokenizer's table, or empty) are never allowed.
  std::vector<uint32_t> lengths(vocab_size);
  std::string bytes;
  for (size_t t = 0; t < vocab_size; ++t) {
    const int32_t token = static_cast<int32_t>(t);
    const size_t before = bytes.size();
    if (t < table.size() && table.special(token)) {
      bytes += '\xff';
      if (table.length(token) > 0) {
        bytes.append(table.bytes(token), table.length(token));
      } else {
        bytes += "<[" + std::to_string(t) + "]>";
      }
    } else if (t < table.size()) {
      bytes.append(table.bytes(token), table.length(token));
    }
    lengths[t] = static_cast<uint32_t>(bytes.size() - before);
  }
  std::vector<uint32_t> extra_eos;
  for (size_t i = 1; i < eos_ids.size(); ++i) extra_eos.push_back(static_cast<uint32_t>(eos_ids[i]));
  LlgTokenizerInitV2 init{};
  init.struct_size = sizeof(init);
  init.vocab_size = static_cast<uint32_t>(vocab_size);
  init.tok_eos = static_cast<uint32_t>(eos_ids[0]);
  init.token_lens = lengths.data();
  init.token_bytes = reinterpret_cast<const uint8_t*>(bytes.data());
  // Where a grammar forces text, llguidance allows only the first token of that text's
  // tokenization: the model's own tokenizer when one is registered (as 0.18 gives it the model's),
  // checked against the table and else the longest match over the table's bytes. Models without a
  // tokenizer (no directory) use llguidance's approximation, which forces nothing.
  const OgaExtTokenizeFunction tokenize = g_tokenize.load();
  if (tokenize != nullptr && !directory.empty()) {
    tokenize_ = std::make_unique<TokenizeContext>();
    tokenize_->function = tokenize;
    tokenize_->directory = directory;
    tokenize_->table = shared_table;
    for (size_t t = 0; t < table.size() && t < vocab_size; ++t) {
      const int32_t token = static_cast<int32_t>(t);
      if (table.special(token) || table.length(token) == 0) continue;
      tokenize_->ids.emplace(std::string(table.bytes(token), table.length(token)), static_cast<uint32_t>(t));
      tokenize_->longest = std::max(tokenize_->longest, table.length(token));
    }
    init.tokenize_fn = [](const void* data, const uint8_t* bytes, size_t count, uint32_t* tokens,
                          size_t capacity) -> size_t {
      return static_cast<const TokenizeContext*>(data)->Tokenize(bytes, count, tokens, capacity);
    };
    init.tokenize_user_data = tokenize_.get();
    init.tokenize_assumes_string = true;  // the registered function takes UTF-8 text
  } else {
    init.use_approximate_greedy_tokenize_fn = true;
  }
  char error[1024] = {};
  tokenizer_ = api_->new_tokenizer_v2(&init, error, sizeof(error));
  if (tokenizer_ == nullptr) {
    error[sizeof(error) - 1] = '\0';
    throw ApiError(std::string("llguidance rejected the model's tokenizer: ") + error);
  }
}

GuidanceTokenizer::~GuidanceTokenizer() { api_->free_tokenizer(tokenizer_); }

GuidanceCursor::GuidanceCursor(std::shared_ptr<const GuidanceTokenizer> tokenizer, const std::string& type,
                               const std::string& data)
    : tokenizer_(std::move(tokenizer)) {
  const GuidanceApi& api = tokenizer_->api();
  ConstraintInitBuffer buffer;
  std::memset(&buffer, 0, sizeof(buffer));  // fields a newer library adds stay zero
  api.constraint_init_set_defaults(&buffer, tokenizer_->handle());
  buffer.init.log_buffer_level = 0;
  buffer.init.log_stderr_level = 0;  // errors reach the caller as messages, not on stderr
  buffer.init.limits.verbose_errors = false;
  const char* kind = type == "lark_grammar" ? "lark" : type.c_str();  // json_schema and regex keep their names
  t_tokenize_interrupted = false;
  matcher_ = api.new_matcher(&buffer, kind, data.c_str());
  if (matcher_ == nullptr) throw ApiError("llguidance could not create a matcher for the " + type + " guidance.");
  if (t_tokenize_interrupted) {
    t_tokenize_interrupted = false;
    api.free_matcher(matcher_);
    throw InterruptedError("the tokenizer guidance called was interrupted");
  }
  if (const char* error = api.matcher_get_error(matcher_); error != nullptr) {
    const std::string reason = FirstLine(error);
    api.free_matcher(matcher_);
    throw ApiError("Invalid " + type + " guidance: " + reason);
  }
  const size_t bytes = api.matcher_get_mask_byte_size(matcher_);
  try {
    mask_.assign((bytes + 3) / 4, 0);
    // The first mask is computed here (and kept for the first step), so a grammar that cannot
    // start with any token of the vocabulary is this call's error rather than a failed turn.
    const uint32_t* first = Mask();
    bool any = false;
    for (size_t word = 0; first != nullptr && word < mask_.size() && !any; ++word) any = first[word] != 0;
    // llguidance reports "NoExtensionBias" when no token extends the (empty) text.
    if (!any && (first != nullptr || error_ == "NoExtensionBias")) {
      throw ApiError("Invalid " + type + " guidance: no token of the model's vocabulary can start it.");
    }
    if (first == nullptr) throw ApiError("Invalid " + type + " guidance: " + error_);
  } catch (...) {
    api.free_matcher(matcher_);
    throw;
  }
}

GuidanceCursor::~GuidanceCursor() { tokenizer_->api().free_matcher(matcher_); }

const uint32_t* GuidanceCursor::Mask() {
  if (poisoned_) return nullptr;
  if (!mask_valid_) {
    t_tokenize_interrupted = false;
    const int32_t status = tokenizer_->api().matcher_compute_mask_into(matcher_, mask_.data(), mask_.size() * 4);
    if (t_tokenize_interrupted) {
      // The mask may rest on a fallback tokenization: computed again when the step is retried.
      t_tokenize_interrupted = false;
      throw InterruptedError("the tokenizer guidance called was interrupted");
    }
    if (status != 0) {
      Poison("llguidance failed to compute a token mask");
      return nullptr;
    }
    mask_valid_ = true;
  }
  return mask_.data();
}

void GuidanceCursor::Consume(int32_t token) noexcept {
  if (poisoned_) return;
  mask_valid_ = false;
  if (tokenizer_->api().matcher_consume_token(matcher_, static_cast<uint32_t>(token)) != 0) {
    Poison("llguidance rejected a committed token");
  }
}

void GuidanceCursor::Poison(const char* fallback) noexcept {
  poisoned_ = true;
  try {
    const std::string reason = FirstLine(tokenizer_->api().matcher_get_error(matcher_));
    error_ = reason.empty() ? fallback : reason;
  } catch (...) {
  }
}

}  // namespace oga
