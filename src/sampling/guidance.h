// Guidance (seed: "Constrained decoding and tool calling"): whole-turn json_schema, regex and
// lark_grammar constraints, run by llguidance through its C API. The library is loaded at run time
// from the shared object that OgaExtSetGuidanceLibrary names (the Python package names the
// llguidance wheel's extension module), so oga builds and runs without it and only guided turns
// need it.
//
// A model builds one GuidanceTokenizer from its token table; each guided turn owns a
// GuidanceCursor (an llguidance matcher) compiled at BeginTurn. The cursor advances only when a
// step commits: a staged step computes the mask from the committed cursor without advancing it, so
// rollback has nothing to undo.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "oga/oga_ext.h"
#include "sampling/token_table.h"

namespace oga {

struct GuidanceApi;  // llguidance's C entry points (guidance.cpp)

// Sets the llguidance library path (empty clears); a library already loaded stays loaded.
void SetGuidanceLibraryPath(const std::string& path);
// Registers the tokenizer guidance uses for text a grammar forces (OgaExtSetTokenizeFunction).
void SetTokenizeFunction(OgaExtTokenizeFunction tokenize);

class GuidanceTokenizer {
 public:
  // Throws ApiError when llguidance is missing or rejects the table. `directory` (may be empty) is
  // the model directory the registered tokenize function reads.
  GuidanceTokenizer(std::shared_ptr<const TokenTable> table, size_t vocab_size, const std::vector<int32_t>& eos_ids,
                    const std::string& directory);
  ~GuidanceTokenizer();
  GuidanceTokenizer(const GuidanceTokenizer&) = delete;
  GuidanceTokenizer& operator=(const GuidanceTokenizer&) = delete;

  const GuidanceApi& api() const { return *api_; }
  const void* handle() const { return tokenizer_; }
  size_t vocab_size() const { return vocab_size_; }

 private:
  // What llguidance's tokenize callback needs; lives as long as the llguidance tokenizer. A
  // tokenization whose tokens do not spell the text (an unknown-token id, for one) is replaced by
  // the longest-match tokenization over the table's exact bytes.
  struct TokenizeContext {
    OgaExtTokenizeFunction function = nullptr;
    std::string directory;
    std::shared_ptr<const TokenTable> table;
    std::unordered_map<std::string, uint32_t> ids;  // text tokens by their bytes (lowest id wins)
    size_t longest = 0;

    size_t Tokenize(const uint8_t* bytes, size_t count, uint32_t* tokens, size_t capacity) const;
    size_t LongestMatch(const uint8_t* bytes, size_t count, uint32_t* tokens, size_t capacity) const;
  };

  const GuidanceApi* api_;
  std::unique_ptr<TokenizeContext> tokenize_;
  void* tokenizer_ = nullptr;  // LlgTokenizer*
  size_t vocab_size_;
};

class GuidanceCursor {
 public:
  // Compiles the grammar; throws ApiError with llguidance's reason when it is invalid.
  GuidanceCursor(std::shared_ptr<const GuidanceTokenizer> tokenizer, const std::string& type, const std::string& data);
  ~GuidanceCursor();
  GuidanceCursor(const GuidanceCursor&) = delete;
  GuidanceCursor& operator=(const GuidanceCursor&) = delete;

  // The tokens the grammar allows next, one bit per token id (bit t % 32 of word t / 32), computed
  // once per committed position. Returns nullptr once the cursor is poisoned. Throws
  // InterruptedError (the cursor unchanged) when the registered tokenizer was interrupted.
  const uint32_t* Mask();
  // Advances past a committed token. A failure poisons the cursor; it never throws.
  void Consume(int32_t token) noexcept;

 private:
  void Poison(const char* fallback) noexcept;

  std::shared_ptr<const GuidanceTokenizer> tokenizer_;
  void* matcher_ = nullptr;  // LlgMatcher*
  std::vector<uint32_t> mask_;
  bool mask_valid_ = false;
  bool poisoned_ = false;
  std::string error_;
};

}  // namespace oga
