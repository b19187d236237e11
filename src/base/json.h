// A small, strict JSON document model for configuration files (genai_config.json, overlays).
//
// Hand-written rather than taken from a library because OGA's error texts carry positions in the
// shape "at line L index I", and its configuration errors point at the cursor just after the
// offending value; both need the start and end of every value, which libraries do not expose.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace oga::json {

// A place in the document. `column` counts bytes from the start of the line (0-based).
struct Position {
  int line = 1;    // 1-based
  int column = 0;  // 0-based byte column within `line`

  // The "index" OGA prints. OGA measures from the start of the document on line 1 but from the
  // preceding '\n' on later lines, so there its index is one more than the 0-based column. We
  // reproduce that so error texts match OGA's byte for byte.
  int OgaIndex() const { return line == 1 ? column : column + 1; }
};

// Formats "JSON Error: <what> at line L index I" (OGA's shape for every configuration error).
std::string FormatError(const std::string& what, Position at);

// An error tied to a place in a document (syntax, unknown key, invalid value). Loading a config
// file prefixes these with the file name, as OGA does; whole-config checks throw plain
// std::runtime_error instead.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Throws json::Error carrying FormatError(what, at).
[[noreturn]] void ThrowError(const std::string& what, Position at);

enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };

// "null", "bool", "number", "string", "array", "object".
const char* TypeName(Type type);

struct Member;

class Value {
 public:
  Value();
  ~Value();
  Value(const Value&);
  Value(Value&&) noexcept;
  Value& operator=(const Value&);
  Value& operator=(Value&&) noexcept;

  static Value Null(Position start, Position end);
  static Value Bool(bool value, Position start, Position end);
  // `integral` is true when the literal had no fraction or exponent and fits in int64_t; then
  // `int_value` is exact. `double_value` is always the nearest double.
  static Value Number(double double_value, bool integral, int64_t int_value, Position start,
                      Position end);
  static Value String(std::string value, Position start, Position end);
  static Value Array(std::vector<Value> elements, Position start, Position end);
  static Value Object(std::vector<Member> members, Position start, Position end);

  Type type() const { return type_; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }

  // Each accessor below is meaningful only for its own type; callers test the type first (on a
  // mismatch it returns an empty/zero default rather than failing).
  bool bool_value() const { return bool_value_; }
  bool is_integral() const { return integral_; }
  int64_t int_value() const { return int_value_; }
  double double_value() const { return double_value_; }
  const std::string& string_value() const { return string_value_; }
  const std::vector<Value>& elements() const { return elements_; }
  const std::vector<Member>& members() const { return members_; }

  // The member named `key` of an object, or nullptr (also for non-objects).
  const Value* Find(std::string_view key) const;
  Value* Find(std::string_view key);

  // Editing (configuration overlays and provider edits). Values built here carry default
  // positions; error positions are only meaningful for parsed values.
  std::vector<Value>& mutable_elements() { return elements_; }
  std::vector<Member>& mutable_members() { return members_; }
  // Replaces the member named `key` of an object in place, or appends it. Returns the stored value.
  Value& Set(std::string_view key, Value value);

  // `start` is the value's first byte; `end` is just past its last byte.
  Position start() const { return start_; }
  Position end() const { return end_; }

 private:
  Type type_ = Type::kNull;
  bool bool_value_ = false;
  bool integral_ = false;
  int64_t int_value_ = 0;
  double double_value_ = 0.0;
  std::string string_value_;
  std::vector<Value> elements_;
  std::vector<Member> members_;  // in document order
  Position start_;
  Position end_;
};

struct Member {
  std::string key;
  Position key_start;  // the opening quote of the key
  Value value;
};

// Containers may nest at most this deep; deeper input is rejected instead of recursing further.
constexpr int kMaxNestingDepth = 256;

// Parses one JSON value (RFC 8259; whitespace may surround it, nothing else may follow it).
// Objects reject duplicate keys. Throws json::Error from ThrowError on any syntax error.
Value Parse(std::string_view text);

// Compact JSON text (no whitespace) that Parse reads back to an equal value: members in order,
// integral numbers as integers, other numbers in their shortest round-trip form, strings with
// only the escapes JSON requires (UTF-8 passes through).
std::string Serialize(const Value& value);

// Overlays `overlay` onto `base`: where both are objects, members merge key by key (recursively,
// new keys appended in overlay order); anything else replaces the base value wholesale (arrays
// included). Merged values keep the positions of the text they came from, so an error found in
// an overlaid value points into the overlay.
void MergeInto(Value& base, const Value& overlay);

}  // namespace oga::json
