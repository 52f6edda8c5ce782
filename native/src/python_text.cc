#include "python_text.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace mitt::native {
namespace {

constexpr uint32_t kCodePoints = 0x110000;

// The next code point of `utf8` from `at` (advanced past it).
uint32_t Decode(std::string_view utf8, size_t& at) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(utf8[i]); };
  const uint8_t first = byte(at);
  size_t length = first < 0x80 ? 1 : first < 0xE0 ? 2 : first < 0xF0 ? 3 : 4;
  length = std::min(length, utf8.size() - at);
  uint32_t value = length == 1 ? first : first & (0x7F >> length);
  for (size_t i = 1; i < length; ++i) value = (value << 6) | (byte(at + i) & 0x3F);
  at += length;
  return value;
}

void Append(std::string& out, uint32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::string Hex(uint32_t value, int digits) {
  char buffer[16];
  std::snprintf(buffer, sizeof buffer, "%0*x", digits, value);
  return buffer;
}

}  // namespace

size_t CodePoints(std::string_view utf8) {
  size_t count = 0;
  for (const char c : utf8) count += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
  return count;
}

std::string FloatRepr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // The fewest significant digits that read back exactly (what Python's repr finds).
  char buffer[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof buffer, "%.*e", precision - 1, value);
    if (std::strtod(buffer, nullptr) == value) break;
  }
  const std::string scientific = buffer;  // [-]d[.ddd]e[+-]XX
  const size_t e = scientific.find('e');
  const bool negative = scientific[0] == '-';
  std::string digits;
  for (size_t i = negative ? 1 : 0; i < e; ++i) {
    if (scientific[i] != '.') digits += scientific[i];
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int exponent = std::atoi(scientific.c_str() + e + 1);
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {  // Python's repr switches to an exponent there
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char tail[16];
    std::snprintf(tail, sizeof tail, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + tail;
  }
  if (exponent < 0) return out + "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
  const auto whole = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= whole) return out + digits + std::string(whole - digits.size(), '0') + ".0";
  return out + digits.substr(0, whole) + "." + digits.substr(whole);
}

std::string Fixed(double value, int digits) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", digits, value);
  return buffer;
}

PythonText::PythonText(std::vector<uint8_t> printable) : printable_(std::move(printable)) {
  if (printable_.size() != kCodePoints / 8) {
    throw std::invalid_argument("the printable table must hold one bit per code point (" +
                                std::to_string(kCodePoints / 8) + " bytes), got " +
                                std::to_string(printable_.size()));
  }
}

bool PythonText::Printable(uint32_t c) const {
  return c < kCodePoints && (printable_[c >> 3] >> (c & 7)) & 1;
}

std::string PythonText::Repr(std::string_view utf8) const {
  const bool double_quoted = utf8.find('\'') != std::string_view::npos && utf8.find('"') == std::string_view::npos;
  const char quote = double_quoted ? '"' : '\'';
  std::string out(1, quote);
  for (size_t at = 0; at < utf8.size();) {
    const uint32_t c = Decode(utf8, at);
    if (c == static_cast<uint32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < ' ' || c == 0x7F) {
      out += "\\x" + Hex(c, 2);
    } else if (c < 0x7F || Printable(c)) {
      Append(out, c);
    } else if (c <= 0xFF) {
      out += "\\x" + Hex(c, 2);
    } else if (c <= 0xFFFF) {
      out += "\\u" + Hex(c, 4);
    } else {
      out += "\\U" + Hex(c, 8);
    }
  }
  return out + quote;
}

std::string PythonText::Shorten(std::string_view utf8, size_t limit) const {
  const std::string shown = Repr(utf8);
  if (CodePoints(shown) <= limit) return shown;
  size_t at = 0;
  for (size_t kept = 0; kept < limit - 3; ++kept) Decode(shown, at);
  return shown.substr(0, at) + "...";
}

std::string PythonText::ListRepr(const std::vector<std::string>& items) const {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + Repr(items[i]);
  return out + "]";
}

}  // namespace mitt::native
