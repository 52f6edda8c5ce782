// Text as the Python engine writes it in its messages: str and float reprs, lengths in
// characters, fixed-point numbers. The native engine's error messages are the Python engine's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mitt::native {

// Counts UTF-8 code points (Python's len of a str); the text is valid UTF-8 (protobuf checked it).
size_t CodePoints(std::string_view utf8);

// Python's repr(float): the shortest digits that read back as `value` ("0.1", "1e-05", "nan").
std::string FloatRepr(double value);

// Python's f"{value:.{digits}f}".
std::string Fixed(double value, int digits);

class PythonText {
 public:
  // printable: one bit per code point 0..0x10FFFF, set when Python's str.isprintable() holds
  // for it (handed over from Python once: the Unicode database stays Python's).
  explicit PythonText(std::vector<uint8_t> printable);

  // Python's repr(str) of `utf8`.
  std::string Repr(std::string_view utf8) const;
  // retrieval.api.errors.shorten: the repr cut to `limit` characters, ending "...".
  std::string Shorten(std::string_view utf8, size_t limit = 64) const;
  // repr of a list of strings: ['a', 'b'].
  std::string ListRepr(const std::vector<std::string>& items) const;

 private:
  bool Printable(uint32_t code_point) const;

  const std::vector<uint8_t> printable_;
};

}  // namespace mitt::native
