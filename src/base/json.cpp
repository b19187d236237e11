#include "base/json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <unordered_set>
#include <utility>

namespace oga::json {

std::string FormatError(const std::string& what, Position at) {
  return "JSON Error: " + what + " at line " + std::to_string(at.line) + " index " +
         std::to_string(at.OgaIndex());
}

void ThrowError(const std::string& what, Position at) { throw Error(FormatError(what, at)); }

const char* TypeName(Type type) {
  switch (type) {
    case Type::kNull:
      return "null";
    case Type::kBool:
      return "bool";
    case Type::kNumber:
      return "number";
    case Type::kString:
      return "string";
    case Type::kArray:
      return "array";
    case Type::kObject:
      return "object";
  }
  return "unknown";
}

// Out of line because Member (which holds a Value) is incomplete inside Value's definition.
Value::Value() = default;
Value::~Value() = default;
Value::Value(const Value&) = default;
Value::Value(Value&&) noexcept = default;
Value& Value::operator=(const Value&) = default;
Value& Value::operator=(Value&&) noexcept = default;

Value Value::Null(Position start, Position end) {
  Value value;
  value.type_ = Type::kNull;
  value.start_ = start;
  value.end_ = end;
  return value;
}

Value Value::Bool(bool bool_value, Position start, Position end) {
  Value value = Null(start, end);
  value.type_ = Type::kBool;
  value.bool_value_ = bool_value;
  return value;
}

Value Value::Number(double double_value, bool integral, int64_t int_value, Position start,
                    Position end) {
  Value value = Null(start, end);
  value.type_ = Type::kNumber;
  value.double_value_ = double_value;
  value.integral_ = integral;
  value.int_value_ = integral ? int_value : 0;
  return value;
}

Value Value::String(std::string string_value, Position start, Position end) {
  Value value = Null(start, end);
  value.type_ = Type::kString;
  value.string_value_ = std::move(string_value);
  return value;
}

Value Value::Array(std::vector<Value> elements, Position start, Position end) {
  Value value = Null(start, end);
  value.type_ = Type::kArray;
  value.elements_ = std::move(elements);
  return value;
}

Value Value::Object(std::vector<Member> members, Position start, Position end) {
  Value value = Null(start, end);
  value.type_ = Type::kObject;
  value.members_ = std::move(members);
  return value;
}

const Value* Value::Find(std::string_view key) const {
  for (const Member& member : members_) {
    if (member.key == key) return &member.value;
  }
  return nullptr;
}

Value* Value::Find(std::string_view key) {
  for (Member& member : members_) {
    if (member.key == key) return &member.value;
  }
  return nullptr;
}

Value& Value::Set(std::string_view key, Value value) {
  if (Value* existing = Find(key)) {
    *existing = std::move(value);
    return *existing;
  }
  Member member;
  member.key = std::string(key);
  member.value = std::move(value);
  members_.push_back(std::move(member));
  return members_.back().value;
}

namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

int HexDigitValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void AppendUtf8(uint32_t code_point, std::string& out) {
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (code_point >> 18)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

// How a UTF-8 sequence starting with `lead` continues: total length (0 = invalid lead byte) and
// the allowed range of the second byte, which is where overlong forms, surrogates and code points
// above U+10FFFF are excluded (RFC 3629, table 3-7 of the Unicode standard).
struct Utf8Lead {
  int length = 0;
  unsigned char second_min = 0x80;
  unsigned char second_max = 0xBF;
};

Utf8Lead ClassifyUtf8Lead(unsigned char lead) {
  if (lead >= 0xC2 && lead <= 0xDF) return {2, 0x80, 0xBF};
  if (lead == 0xE0) return {3, 0xA0, 0xBF};
  if (lead == 0xED) return {3, 0x80, 0x9F};
  if (lead >= 0xE1 && lead <= 0xEF) return {3, 0x80, 0xBF};
  if (lead == 0xF0) return {4, 0x90, 0xBF};
  if (lead >= 0xF1 && lead <= 0xF3) return {4, 0x80, 0xBF};
  if (lead == 0xF4) return {4, 0x80, 0x8F};
  return {};
}

std::string DescribeCharacter(char c) {
  const auto byte = static_cast<unsigned char>(c);
  if (byte >= 0x21 && byte < 0x7F) return std::string("'") + c + "'";
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02X", byte);
  return hex;
}

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Value ParseDocument() {
    SkipWhitespace();
    Value root = ParseValue(0);
    SkipWhitespace();
    if (!AtEnd()) Fail("Unexpected data after the JSON value");
    return root;
  }

 private:
  bool AtEnd() const { return offset_ >= text_.size(); }
  char Peek() const { return text_[offset_]; }
  Position Here() const { return {line_, static_cast<int>(offset_ - line_start_)}; }

  [[noreturn]] void Fail(const std::string& what) const { ThrowError(what, Here()); }

  char Next() {
    if (AtEnd()) Fail("Unexpected end of input");
    return text_[offset_++];
  }

  void SkipWhitespace() {
    while (!AtEnd()) {
      const char c = Peek();
      if (c == '\n') {
        ++line_;
        line_start_ = offset_ + 1;
      } else if (c != ' ' && c != '\t' && c != '\r') {
        return;
      }
      ++offset_;
    }
  }

  // `depth` counts the containers enclosing this value.
  Value ParseValue(int depth) {
    if (AtEnd()) Fail("Unexpected end of input");
    const char c = Peek();
    if (c == '{') return ParseObject(depth + 1);
    if (c == '[') return ParseArray(depth + 1);
    if (c == '"') {
      const Position start = Here();
      std::string text = ParseString();
      return Value::String(std::move(text), start, Here());
    }
    if (c == '-' || IsDigit(c)) return ParseNumber();
    const Position start = Here();
    if (c == 't') {
      SkipKeyword("true");
      return Value::Bool(true, start, Here());
    }
    if (c == 'f') {
      SkipKeyword("false");
      return Value::Bool(false, start, Here());
    }
    if (c == 'n') {
      SkipKeyword("null");
      return Value::Null(start, Here());
    }
    Fail("Unexpected character " + DescribeCharacter(c));
  }

  void CheckNestingDepth(int depth) const {
    if (depth > kMaxNestingDepth) {
      Fail("Nesting deeper than " + std::to_string(kMaxNestingDepth) + " levels");
    }
  }

  Value ParseObject(int depth) {
    CheckNestingDepth(depth);
    const Position start = Here();
    ++offset_;  // '{'
    std::vector<Member> members;
    std::unordered_set<std::string> keys_seen;
    SkipWhitespace();
    if (!AtEnd() && Peek() == '}') {
      ++offset_;
      return Value::Object(std::move(members), start, Here());
    }
    while (true) {
      SkipWhitespace();
      if (AtEnd() || Peek() != '"') Fail("Expected a string to start an object key");
      Member member;
      member.key_start = Here();
      member.key = ParseString();
      if (!keys_seen.insert(member.key).second) {
        ThrowError("Duplicate key \"" + member.key + "\"", member.key_start);
      }
      SkipWhitespace();
      if (AtEnd() || Peek() != ':') Fail("Expected ':' after an object key");
      ++offset_;
      SkipWhitespace();
      member.value = ParseValue(depth);
      members.push_back(std::move(member));
      SkipWhitespace();
      const char separator = Next();
      if (separator == '}') break;
      if (separator != ',') {
        --offset_;  // point at the offending character
        Fail("Expected ',' or '}' in an object");
      }
    }
    return Value::Object(std::move(members), start, Here());
  }

  Value ParseArray(int depth) {
    CheckNestingDepth(depth);
    const Position start = Here();
    ++offset_;  // '['
    std::vector<Value> elements;
    SkipWhitespace();
    if (!AtEnd() && Peek() == ']') {
      ++offset_;
      return Value::Array(std::move(elements), start, Here());
    }
    while (true) {
      SkipWhitespace();
      elements.push_back(ParseValue(depth));
      SkipWhitespace();
      const char separator = Next();
      if (separator == ']') break;
      if (separator != ',') {
        --offset_;
        Fail("Expected ',' or ']' in an array");
      }
    }
    return Value::Array(std::move(elements), start, Here());
  }

  void SkipKeyword(std::string_view keyword) {
    if (text_.substr(offset_, keyword.size()) != keyword) {
      Fail("Invalid literal (expected " + std::string(keyword) + ")");
    }
    offset_ += keyword.size();
  }

  // Scans the RFC 8259 number grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
  Value ParseNumber() {
    const Position start = Here();
    const size_t begin = offset_;
    bool has_fraction_or_exponent = false;
    if (Peek() == '-') ++offset_;
    if (AtEnd() || !IsDigit(Peek())) Fail("Invalid number");
    if (Peek() == '0') {
      ++offset_;
      if (!AtEnd() && IsDigit(Peek())) Fail("Invalid number (leading zero)");
    } else {
      SkipDigits();
    }
    if (!AtEnd() && Peek() == '.') {
      has_fraction_or_exponent = true;
      ++offset_;
      if (AtEnd() || !IsDigit(Peek())) Fail("Invalid number (digit expected after '.')");
      SkipDigits();
    }
    if (!AtEnd() && (Peek() == 'e' || Peek() == 'E')) {
      has_fraction_or_exponent = true;
      ++offset_;
      if (!AtEnd() && (Peek() == '+' || Peek() == '-')) ++offset_;
      if (AtEnd() || !IsDigit(Peek())) Fail("Invalid number (digit expected in exponent)");
      SkipDigits();
    }
    const char* first = text_.data() + begin;
    const char* last = text_.data() + offset_;

    double double_value = 0.0;
    const auto double_result = std::from_chars(first, last, double_value);
    if (double_result.ec != std::errc() || !std::isfinite(double_value)) {
      ThrowError("Number out of range", start);
    }
    int64_t int_value = 0;
    bool integral = false;
    if (!has_fraction_or_exponent) {
      const auto int_result = std::from_chars(first, last, int_value);
      integral = int_result.ec == std::errc() && int_result.ptr == last;
    }
    return Value::Number(double_value, integral, int_value, start, Here());
  }

  void SkipDigits() {
    while (!AtEnd() && IsDigit(Peek())) ++offset_;
  }

  // Parses a string starting at its opening quote; leaves the cursor after the closing quote.
  std::string ParseString() {
    ++offset_;  // '"'
    std::string out;
    while (true) {
      if (AtEnd()) Fail("Unterminated string");
      const char c = Peek();
      const auto byte = static_cast<unsigned char>(c);
      if (c == '"') {
        ++offset_;
        return out;
      }
      if (c == '\\') {
        ParseEscape(out);
      } else if (byte < 0x20) {
        Fail("Unescaped control character " + DescribeCharacter(c) + " in string");
      } else if (byte < 0x80) {
        out.push_back(c);
        ++offset_;
      } else {
        CopyUtf8Sequence(out);
      }
    }
  }

  // Raw bytes are copied through, but only as well-formed UTF-8 so every string we hand out is
  // valid UTF-8 (the same guarantee the \u escapes give).
  void CopyUtf8Sequence(std::string& out) {
    const Utf8Lead lead = ClassifyUtf8Lead(static_cast<unsigned char>(Peek()));
    if (lead.length == 0 || offset_ + lead.length > text_.size()) Fail("Invalid UTF-8 in string");
    for (int i = 1; i < lead.length; ++i) {
      const auto byte = static_cast<unsigned char>(text_[offset_ + i]);
      const unsigned char min = i == 1 ? lead.second_min : 0x80;
      const unsigned char max = i == 1 ? lead.second_max : 0xBF;
      if (byte < min || byte > max) Fail("Invalid UTF-8 in string");
    }
    out.append(text_.data() + offset_, lead.length);
    offset_ += lead.length;
  }

  void ParseEscape(std::string& out) {
    const Position escape_start = Here();
    ++offset_;  // '\'
    if (AtEnd()) Fail("Unterminated string");
    const char kind = text_[offset_++];
    switch (kind) {
      case '"':
      case '\\':
      case '/':
        out.push_back(kind);
        return;
      case 'b':
        out.push_back('\b');
        return;
      case 'f':
        out.push_back('\f');
        return;
      case 'n':
        out.push_back('\n');
        return;
      case 'r':
        out.push_back('\r');
        return;
      case 't':
        out.push_back('\t');
        return;
      case 'u':
        AppendUtf8(ParseUnicodeEscape(escape_start), out);
        return;
      default:
        ThrowError("Invalid escape sequence \\" + std::string(1, kind), escape_start);
    }
  }

  // Called after "\u"; combines a UTF-16 surrogate pair written as two escapes.
  uint32_t ParseUnicodeEscape(Position escape_start) {
    const uint32_t unit = ParseHex4(escape_start);
    if (unit >= 0xDC00 && unit <= 0xDFFF) {
      ThrowError("Unpaired low surrogate in \\u escape", escape_start);
    }
    if (unit < 0xD800 || unit > 0xDBFF) return unit;
    if (text_.substr(offset_, 2) != "\\u") {
      ThrowError("Unpaired high surrogate in \\u escape", escape_start);
    }
    const Position low_start = Here();
    offset_ += 2;
    const uint32_t low = ParseHex4(low_start);
    if (low < 0xDC00 || low > 0xDFFF) {
      ThrowError("Unpaired high surrogate in \\u escape", escape_start);
    }
    return 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
  }

  uint32_t ParseHex4(Position escape_start) {
    uint32_t unit = 0;
    for (int i = 0; i < 4; ++i) {
      const int digit = AtEnd() ? -1 : HexDigitValue(Peek());
      if (digit < 0) ThrowError("Invalid \\u escape (four hex digits expected)", escape_start);
      unit = unit * 16 + static_cast<uint32_t>(digit);
      ++offset_;
    }
    return unit;
  }

  std::string_view text_;
  size_t offset_ = 0;
  int line_ = 1;
  size_t line_start_ = 0;  // offset of the first byte of the current line
};

}  // namespace

Value Parse(std::string_view text) { return Parser(text).ParseDocument(); }

namespace {

void SerializeString(const std::string& text, std::string& out) {
  out.push_back('"');
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escape[8];
          std::snprintf(escape, sizeof escape, "\\u%04X", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += escape;
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

void SerializeNumber(const Value& value, std::string& out) {
  char digits[64];
  if (value.is_integral()) {
    const auto result = std::to_chars(digits, digits + sizeof digits, value.int_value());
    out.append(digits, result.ptr);
    return;
  }
  // Shortest form that parses back to the same double; a fraction or exponent marker is kept so
  // the value reads back as non-integral too.
  const auto result = std::to_chars(digits, digits + sizeof digits, value.double_value());
  const std::string_view text(digits, static_cast<size_t>(result.ptr - digits));
  out += text;
  if (text.find_first_of(".eE") == std::string_view::npos) out += ".0";
}

void SerializeTo(const Value& value, std::string& out) {
  switch (value.type()) {
    case Type::kNull:
      out += "null";
      return;
    case Type::kBool:
      out += value.bool_value() ? "true" : "false";
      return;
    case Type::kNumber:
      SerializeNumber(value, out);
      return;
    case Type::kString:
      SerializeString(value.string_value(), out);
      return;
    case Type::kArray: {
      out.push_back('[');
      bool first = true;
      for (const Value& element : value.elements()) {
        if (!first) out.push_back(',');
        first = false;
        SerializeTo(element, out);
      }
      out.push_back(']');
      return;
    }
    case Type::kObject: {
      out.push_back('{');
      bool first = true;
      for (const Member& member : value.members()) {
        if (!first) out.push_back(',');
        first = false;
        SerializeString(member.key, out);
        out.push_back(':');
        SerializeTo(member.value, out);
      }
      out.push_back('}');
      return;
    }
  }
}

}  // namespace

std::string Serialize(const Value& value) {
  std::string out;
  SerializeTo(value, out);
  return out;
}

void MergeInto(Value& base, const Value& overlay) {
  if (!base.is_object() || !overlay.is_object()) {
    base = overlay;
    return;
  }
  for (const Member& member : overlay.members()) {
    if (Value* existing = base.Find(member.key)) {
      MergeInto(*existing, member.value);
    } else {
      base.mutable_members().push_back(member);
    }
  }
}

}  // namespace oga::json
