#include "serve/frontends/ascii_infer_request.h"

#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "serve/frontends/json_codec.h"

namespace shoal::serve {
namespace {

template <typename T>
void Store(std::byte* out, T value) {
  std::memcpy(out, &value, sizeof(T));
}

// Every power of ten a double holds exactly.
constexpr double kPowersOfTen[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                   1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                   1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
constexpr uint64_t kPowersOfTenInt[] = {1,      10,      100,      1000,     10000,
                                         100000, 1000000, 10000000, 100000000};

// The value of eight decimal digits, one per byte (0 to 9), the first byte the most
// significant: pairs, then quads, then the eight, each step a multiply and a shift.
inline uint64_t EightDigitsValue(uint64_t digits) {
  digits = digits * 10 + (digits >> 8);  // byte pairs: 10 * d[2i] + d[2i + 1] in even bytes
  return (((digits & 0x000000FF000000FF) * (100 + (uint64_t{1000000} << 32))) +
          (((digits >> 16) & 0x000000FF000000FF) * (1 + (uint64_t{10000} << 32)))) >>
         32;
}

// Appends the digits that start the eight bytes at `p` (all of which must be readable) to
// `value`, as TakeDigits does, and returns how many there were: 8 when all eight are, and the
// run may go on.
inline int TakeDigitsOfWord(const char* p, uint64_t& value) {
  uint64_t word;
  std::memcpy(&word, p, sizeof(word));
  const uint64_t digits = word ^ 0x3030303030303030;  // a digit's byte is now 0 to 9
  // Bit 7 of each byte that is not a digit: 0x76 carries a byte of 10..0x7F into bit 7, and
  // the masked add cannot carry into the next byte.
  const uint64_t other =
      (((digits & 0x7F7F7F7F7F7F7F7F) + 0x7676767676767676) | digits) & 0x8080808080808080;
  if (other == 0) [[unlikely]] {
    value = value * 100000000 + EightDigitsValue(digits);
    return 8;
  }
  const int n = std::countr_zero(other) >> 3;
  if (n == 0) [[unlikely]] return 0;
  // The run to the top bytes; the bytes shifted in are leading zero digits.
  value = value * kPowersOfTenInt[n] + EightDigitsValue(digits << (8 * (8 - n)));
  return n;
}

// Appends the run of ASCII digits at `p` to `value` (value * 10^n + the run's n digits; it
// wraps past 19 digits, which the caller counts) and returns where the run ends. Eight bytes
// at a time while eight are left before `end`: a number's digits cost a few instructions
// each, where a loop over bytes costs a dozen (a tensor's data is mostly digits).
inline const char* TakeDigits(const char* p, const char* end, uint64_t& value) {
  while (end - p >= 8) {
    const int n = TakeDigitsOfWord(p, value);
    p += n;
    if (n < 8) return p;
  }
  for (; p != end && *p >= '0' && *p <= '9'; ++p) {
    value = value * 10 + static_cast<uint64_t>(*p - '0');
  }
  return p;
}

// Where the run of a string's plain characters (printable ASCII other than '"' and '\\')
// that starts at `p` ends. Eight bytes at a time while eight are left, as TakeDigits.
inline const char* PlainCharsEnd(const char* p, const char* end) {
  constexpr uint64_t kOnes = 0x0101010101010101;
  constexpr uint64_t kHighBits = kOnes * 0x80;
  while (end - p >= 8) {
    uint64_t word;
    std::memcpy(&word, p, sizeof(word));
    // Per byte, on its low seven bits x (0 to 127): x + 0x7F reaches bit 7 unless x is 0, and
    // x + 0x60 unless x < 0x20; neither sum carries into the next byte. A byte of 0x80 and up
    // has bit 7 set already.
    uint64_t low = word & ~kHighBits;
    uint64_t quote = ~((low ^ (kOnes * '"')) + kOnes * 0x7F);
    uint64_t backslash = ~((low ^ (kOnes * '\\')) + kOnes * 0x7F);
    uint64_t control = ~(low + kOnes * 0x60);
    uint64_t special = (quote | backslash | control | word) & kHighBits;
    if (special != 0) return p + (std::countr_zero(special) >> 3);
    p += 8;
  }
  for (; p != end; ++p) {
    auto c = static_cast<unsigned char>(*p);
    if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
  }
  return p;
}

// The common form in plain ASCII, read in one pass: DecodeAscii below. Every method returns
// false for anything it does not take; the caller then gives up.
class AsciiReader {
 public:
  AsciiReader(const char* at, const char* end) : at_(at), end_(end) {}

  const char* position() const { return at_; }

  bool AtEnd() {
    SkipSpace();
    return at_ == end_;
  }
  // The next character, after whitespace, is `c`; taken if so.
  bool Take(char c) {
    SkipSpace();
    if (at_ == end_ || *at_ != c) return false;
    ++at_;
    return true;
  }
  bool Next(char c) {
    SkipSpace();
    return at_ != end_ && *at_ == c;
  }
  // A string of printable ASCII without escapes: its characters, as they are.
  bool String(std::string_view* out) {
    if (!Take('"')) return false;
    const char* start = at_;
    const char* p = PlainCharsEnd(at_, end_);
    if (p == end_ || *p != '"') return false;
    *out = std::string_view(start, static_cast<size_t>(p - start));
    at_ = p + 1;
    return true;
  }

  // A JSON number. An integer is read exactly, as simdjson reads it: negative ones down to
  // -2^63, others up to 2^64 - 1, "-0" as 0; any other number as the nearest double
  // (std::from_chars rounds correctly, as strtod and simdjson do). Integers past those ranges
  // and numbers past the double range are left to the other decoders.
  struct Number {
    bool integer = false;
    bool negative = false;
    uint64_t magnitude = 0;  // of an integer
    double real = 0;         // of any other number

    // As simdjson's int64 or uint64 converts to double.
    double AsDouble() const {
      if (!integer) return real;
      if (magnitude == 0) return 0.0;
      return negative ? -static_cast<double>(magnitude) : static_cast<double>(magnitude);
    }
  };
  bool ReadNumber(Number* number) {
    SkipSpace();
    // A local cursor: the loops below keep it in a register, which at_ (a member the stores
    // through `number` might alias) would not be.
    const char* p = at_;
    const char* const end = end_;
    const char* start = p;
    number->negative = p != end && *p == '-';
    if (number->negative) ++p;
    if (p == end) return false;
    // The digits, up to 19 of them, as one integer: with the exponent, the number exactly.
    uint64_t digits = 0;
    int digit_count = 0;
    int exponent = 0;
    const char* integer_start = p;
    if (*p == '0') {
      ++p;
    } else if (*p >= '1' && *p <= '9') {
      p = TakeDigits(p, end, digits);
      digit_count = static_cast<int>(p - integer_start);
    } else {
      return false;
    }
    const char* integer_end = p;
    bool integer = true;
    if (p != end && *p == '.') {
      integer = false;
      const char* fraction = ++p;
      // A fraction's leading zeros do not count as digits when the integer part is 0.
      if (digits == 0) {
        while (p != end && *p == '0') ++p;
      }
      const char* significant = p;
      p = TakeDigits(p, end, digits);
      if (p == fraction) return false;
      digit_count += static_cast<int>(p - significant);
      exponent = -static_cast<int>(p - fraction);
    }
    if (p != end && (*p == 'e' || *p == 'E')) {
      integer = false;
      ++p;
      bool negative_exponent = p != end && *p == '-';
      if (p != end && (*p == '+' || *p == '-')) ++p;
      const char* exponent_start = p;
      int written = 0;
      for (; p != end && IsDigit(*p); ++p) {
        if (written < 10000) written = written * 10 + (*p - '0');
      }
      if (p == exponent_start) return false;
      exponent += negative_exponent ? -written : written;
    }
    at_ = p;
    number->integer = integer;
    if (integer) {
      if (integer_end - integer_start > 20) return false;
      uint64_t magnitude = 0;
      for (const char* d = integer_start; d != integer_end; ++d) {
        auto digit = static_cast<uint64_t>(*d - '0');
        if (magnitude > (UINT64_MAX - digit) / 10) return false;
        magnitude = magnitude * 10 + digit;
      }
      if (number->negative && magnitude > (uint64_t{1} << 63)) return false;
      number->magnitude = magnitude;
      return true;
    }
    // Clinger's fast path: digits and a power of ten both exact in a double, so one IEEE
    // multiplication or division rounds the result correctly. Anything else: from_chars.
    if (digit_count <= 19 && digits <= (uint64_t{1} << 53) && exponent >= -22 &&
        exponent <= 22) {
      double value = static_cast<double>(digits);
      value = exponent < 0 ? value / kPowersOfTen[-exponent] : value * kPowersOfTen[exponent];
      number->real = number->negative ? -value : value;
      return true;
    }
    auto [parsed_end, error] = std::from_chars(start, p, number->real);
    return error == std::errc() && parsed_end == p;
  }

  // A number as the general decoder reads it into a double (ReadNumber, then AsDouble). The
  // forms most bodies use, an integer of up to 15 digits or digits, a point and digits (19
  // significant at most), are read here in one go; any other by ReadNumber.
  // Inlined into ReadRealList's loop: a call per number cost a fifth of the number.
  [[gnu::always_inline]] bool ReadReal(double* out) {
    SkipSpace();
    const char* p = at_;
    const char* const end = end_;
    if (p == end) return false;
    const bool negative = *p == '-';
    p += negative ? 1 : 0;
    if (p == end) return false;
    const char* const first = p;
    uint64_t digits = 0;
    if (*p == '0') {
      ++p;
    } else {
      p = TakeDigits(p, end, digits);
      if (p == first) return false;
    }
    const auto integer_digits = static_cast<int>(p - first);
    if (p == end || (*p != '.' && *p != 'e' && *p != 'E')) {
      if (integer_digits > 15) return ReadRealSlowly(out);
      // As simdjson's int64 converts: "-0" is +0.0.
      double value = static_cast<double>(digits);
      *out = negative && digits != 0 ? -value : value;
      at_ = p;
      return true;
    }
    if (*p != '.') return ReadRealSlowly(out);
    const char* const fraction = ++p;
    p = TakeDigits(p, end, digits);
    const auto fraction_digits = static_cast<int>(p - fraction);
    // At most 19 digits in all, so the fraction's power of ten (<= 10^18) is exact too.
    if (fraction_digits == 0 || integer_digits + fraction_digits > 19 ||
        digits > (uint64_t{1} << 53) || (p != end && (*p == 'e' || *p == 'E'))) {
      return ReadRealSlowly(out);
    }
    // Clinger's fast path, as in ReadNumber.
    double value = static_cast<double>(digits) / kPowersOfTen[fraction_digits];
    *out = negative ? -value : value;
    at_ = p;
    return true;
  }

  // The values of a flat list of reals from here on, as ReadReal reads them, while each is
  // written plainly ([-]digits[.digits], at most seven digits before the point, 19 in all) and
  // followed at once by a comma; stores them from out[count] on (room for `capacity`) and
  // stops before the first value it does not take, which ReadReal then reads. Only where 40
  // bytes are left: a value it takes, with its comma and one blank, spans at most 23 bytes,
  // so nothing here checks where the body ends but the run of a long fraction's digits and
  // the blanks after a comma. Most requests spend their decoding here.
  template <typename Real>
  void TakePlainReals(std::byte* out, size_t capacity, size_t& count) {
    // Locals: the stores through `out` may alias any member or reference, which would then
    // be read again after each value.
    const char* p = at_;
    const char* const end = end_;
    size_t taken = count;
    while (end - p >= 40 && taken < capacity) {
      // Branches, not arithmetic on what was read: a predicted branch lets the next value's
      // reading start before this one's bytes are known, where `p + (c == '-')` would chain
      // every value's loads to the one before it.
      const char* first = p;
      bool negative = false;
      if (*first == '-') [[unlikely]] {
        negative = true;
        ++first;
      }
      int integer_digits = 1;
      uint64_t value = 0;
      // "0." starts most values of a normalised input: its integer part needs no reading.
      if (first[0] != '0' || first[1] != '.') {
        integer_digits = TakeDigitsOfWord(first, value);
        // Eight digits or more, none, or a leading zero (JSON's error, ReadReal's to report).
        if (integer_digits == 0 || integer_digits == 8 || (integer_digits > 1 && *first == '0')) {
          break;
        }
      }
      const char* q = first + integer_digits;
      double real;
      if (*q == '.') {
        const char* const fraction = q + 1;
        // The fraction's first eight bytes without a check of the body's end (40 bytes are
        // left); TakeDigits reads on only for a longer fraction.
        q = fraction + TakeDigitsOfWord(fraction, value);
        if (q == fraction + 8) q = TakeDigits(q, end, value);
        const auto fraction_digits = static_cast<int>(q - fraction);
        if (fraction_digits == 0 || integer_digits + fraction_digits > 19 ||
            value > (uint64_t{1} << 53)) {
          break;
        }
        // Clinger's fast path, as in ReadReal.
        real = static_cast<double>(value) / kPowersOfTen[fraction_digits];
        real = negative ? -real : real;
      } else {
        // As simdjson's int64 converts: "-0" is +0.0.
        real = static_cast<double>(value);
        real = negative && value != 0 ? -real : real;
      }
      // An exponent, a blank before the comma or the list's end: ReadReal's to read.
      if (*q != ',') break;
      Store(out + taken * sizeof(Real), static_cast<Real>(real));
      ++taken;
      p = PastComma(q, end);
    }
    at_ = p;
    count = taken;
  }

  // The values of a flat list of integers from here on, as StoreAscii stores them, while each
  // is written plainly ([-]digits, at most eight of them, no leading zero) and followed at once
  // by a comma; stores them from out[count] on (room for `capacity`) and stops before the
  // first value it does not take, which StoreAscii then reads. Eight digits fit every Integer
  // this is for (32 and 64 bits), so nothing is range-checked. Only where 16 bytes are left: a
  // value it takes, with its comma and one blank, spans at most 11. A language model's token
  // ids are such lists.
  template <typename Integer>
  void TakePlainIntegers(std::byte* out, size_t capacity, size_t& count) {
    static_assert(std::is_signed_v<Integer> && sizeof(Integer) >= 4);
    // Locals, as in TakePlainReals.
    const char* p = at_;
    const char* const end = end_;
    size_t taken = count;
    while (end - p >= 16 && taken < capacity) {
      const char* first = p;
      bool negative = false;
      if (*first == '-') [[unlikely]] {
        negative = true;
        ++first;
      }
      uint64_t value = 0;
      const int digits = TakeDigitsOfWord(first, value);
      // None, or a leading zero (JSON's error, StoreAscii's to report).
      if (digits == 0 || (digits > 1 && *first == '0')) break;
      const char* q = first + digits;
      // A ninth digit, a point or an exponent (not an integer), a blank before the comma or
      // the list's end: StoreAscii's to read.
      if (*q != ',') break;
      const auto magnitude = static_cast<Integer>(value);
      Store(out + taken * sizeof(Integer),
            negative ? static_cast<Integer>(-magnitude) : magnitude);
      ++taken;
      p = PastComma(q, end);
    }
    at_ = p;
    count = taken;
  }

  bool Literal(std::string_view word) {
    SkipSpace();
    if (static_cast<size_t>(end_ - at_) < word.size() ||
        std::string_view(at_, word.size()) != word) {
      return false;
    }
    at_ += word.size();
    return true;
  }

  // Steps over a list of numbers, literals and lists (a tensor's data), checking only its
  // brackets: it is read for real later, from where it started.
  bool SkipList() {
    if (!Next('[')) return false;
    int depth = 0;
    for (; at_ != end_; ++at_) {
      char c = *at_;
      if (c == '[') {
        ++depth;
      } else if (c == ']') {
        if (--depth == 0) {
          ++at_;
          return true;
        }
      } else if (c == '"' || c == '{' || c == '}') {
        return false;
      }
    }
    return false;
  }

 private:
  [[gnu::noinline]] bool ReadRealSlowly(double* out) {
    Number number;
    if (!ReadNumber(&number)) return false;
    *out = number.AsDouble();
    return true;
  }

  // Where the next value starts after the comma at `comma`, in a list the shortcuts take:
  // past the blank most writers put after it (", "), then past any others.
  [[gnu::always_inline]] static const char* PastComma(const char* comma, const char* end) {
    const char* q = comma + 1;
    if (*q == ' ') [[likely]] ++q;
    while (q != end && static_cast<unsigned char>(*q) <= ' ' && IsBlank(*q)) ++q;
    return q;
  }

  static bool IsDigit(char c) { return c >= '0' && c <= '9'; }
  static bool IsBlank(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
  void SkipSpace() {
    const char* p = at_;
    // JSON's four blanks all sort below '!', and most bytes this looks at are not blanks: one
    // comparison turns those away (this loop was the body's single most costly line).
    while (p != end_ && static_cast<unsigned char>(*p) <= ' ' && IsBlank(*p)) {
      ++p;
    }
    at_ = p;
  }

  const char* at_;
  const char* end_;
};

// One value of `type` at `out`, converted as StoreElement converts simdjson's.
bool StoreAscii(AsciiReader& reader, DataType type, std::byte* out) {
  if (type == DataType::kBool) {
    if (reader.Literal("true")) {
      Store(out, uint8_t{1});
      return true;
    }
    if (reader.Literal("false")) {
      Store(out, uint8_t{0});
      return true;
    }
    return false;
  }
  if (type == DataType::kFp32 || type == DataType::kFp64) {
    double real;
    if (!reader.ReadReal(&real)) return false;
    if (type == DataType::kFp64) {
      Store(out, real);
      return true;
    }
    if (std::abs(real) > std::numeric_limits<float>::max()) return false;
    Store(out, static_cast<float>(real));
    return true;
  }
  AsciiReader::Number number;
  if (!reader.ReadNumber(&number)) return false;
  auto store_integer = [&](auto zero) {
    using T = decltype(zero);
    if (!number.integer) return false;
    if (number.negative && number.magnitude != 0) {
      if constexpr (std::is_unsigned_v<T>) {
        return false;
      } else {
        // T's minimum is -2^(bits-1); the magnitude is at most 2^63 (ReadNumber).
        auto most = static_cast<uint64_t>(-(std::numeric_limits<T>::min() + 1)) + 1;
        if (number.magnitude > most) return false;
        Store(out, static_cast<T>(-static_cast<int64_t>(number.magnitude - 1) - 1));
        return true;
      }
    }
    if (number.magnitude > static_cast<uint64_t>(std::numeric_limits<T>::max())) return false;
    Store(out, static_cast<T>(number.magnitude));
    return true;
  };
  switch (type) {
    case DataType::kUint8: return store_integer(uint8_t{});
    case DataType::kInt8: return store_integer(int8_t{});
    case DataType::kInt16: return store_integer(int16_t{});
    case DataType::kInt32: return store_integer(int32_t{});
    case DataType::kInt64: return store_integer(int64_t{});
    case DataType::kBool:
    case DataType::kFp32:
    case DataType::kFp64: break;  // taken above
  }
  return false;
}

// The values of a flat list of floats or doubles into `out` (room for `capacity`), as
// StoreAscii stores them, up to the closing bracket; false as StoreAscii. The datatype is
// decided once, not per value, and most values are taken by TakePlainReals.
template <typename Real>
bool ReadRealList(AsciiReader& reader, std::byte* out, size_t capacity, size_t& count) {
  do {
    reader.TakePlainReals<Real>(out, capacity, count);
    double real;
    if (count >= capacity || !reader.ReadReal(&real)) return false;
    if constexpr (std::is_same_v<Real, float>) {
      if (std::abs(real) > std::numeric_limits<float>::max()) return false;
    }
    Store(out + count * sizeof(Real), static_cast<Real>(real));
    ++count;
  } while (reader.Take(','));
  return true;
}

// The values of a flat list of 32- or 64-bit integers into `out`, as StoreAscii stores them,
// up to the closing bracket; false as StoreAscii. Most values are taken by TakePlainIntegers.
template <typename Integer>
bool ReadIntegerList(AsciiReader& reader, DataType type, std::byte* out, size_t capacity,
                     size_t& count) {
  do {
    reader.TakePlainIntegers<Integer>(out, capacity, count);
    if (count >= capacity || !StoreAscii(reader, type, out + count * sizeof(Integer))) {
      return false;
    }
    ++count;
  } while (reader.Take(','));
  return true;
}

// A list nested as tensor.shape from `dimension` on, or, with `dimension` the last, its values.
bool ReadAsciiNested(AsciiReader& reader, size_t dimension, Tensor& tensor, size_t& count) {
  if (!reader.Take('[')) return false;
  const bool last = dimension + 1 == tensor.shape.size();
  const size_t element_size = DataTypeSize(tensor.datatype);
  int64_t items = 0;
  if (!reader.Take(']')) {
    do {
      if (last) {
        if (count >= tensor.data.size() / element_size ||
            !StoreAscii(reader, tensor.datatype, tensor.data.data() + count * element_size)) {
          return false;
        }
        ++count;
      } else if (!ReadAsciiNested(reader, dimension + 1, tensor, count)) {
        return false;
      }
      ++items;
    } while (reader.Take(','));
    if (!reader.Take(']')) return false;
  }
  return items == tensor.shape[dimension];
}

// `data`, flat or nested exactly as the shape, as StoreData reads it.
bool ReadAsciiData(AsciiReader& reader, Tensor& tensor) {
  size_t count = 0;
  if (!reader.Take('[')) return false;
  const bool nested = reader.Next('[');
  if (nested) {
    if (tensor.shape.size() < 2) return false;
    int64_t rows = 0;
    do {
      if (!ReadAsciiNested(reader, 1, tensor, count)) return false;
      ++rows;
    } while (reader.Take(','));
    if (!reader.Take(']') || rows != tensor.shape[0]) return false;
  } else {
    const size_t element_size = DataTypeSize(tensor.datatype);
    const size_t capacity = tensor.data.size() / element_size;
    if (!reader.Take(']')) {
      bool read;
      if (tensor.datatype == DataType::kFp32) {
        read = ReadRealList<float>(reader, tensor.data.data(), capacity, count);
      } else if (tensor.datatype == DataType::kFp64) {
        read = ReadRealList<double>(reader, tensor.data.data(), capacity, count);
      } else if (tensor.datatype == DataType::kInt64) {
        read = ReadIntegerList<int64_t>(reader, tensor.datatype, tensor.data.data(), capacity,
                                        count);
      } else if (tensor.datatype == DataType::kInt32) {
        read = ReadIntegerList<int32_t>(reader, tensor.datatype, tensor.data.data(), capacity,
                                        count);
      } else {
        do {
          read = count < capacity &&
                 StoreAscii(reader, tensor.datatype, tensor.data.data() + count * element_size);
          count += read ? 1 : 0;
        } while (read && reader.Take(','));
      }
      if (!read || !reader.Take(']')) return false;
    }
  }
  return count * DataTypeSize(tensor.datatype) == tensor.data.size();
}

// Sizes `tensor` for its shape and reads its data from `reader`; false as StoreData.
bool ReadAsciiTensor(AsciiReader& reader, size_t body_bytes, Tensor& tensor) {
  std::optional<int64_t> elements = ElementCount(tensor.shape);
  // A body holds fewer values than bytes: a larger shape is an error, so nothing is allocated.
  if (!elements || static_cast<uint64_t>(*elements) > body_bytes) return false;
  tensor.data.resize(static_cast<size_t>(*elements) * DataTypeSize(tensor.datatype));
  return ReadAsciiData(reader, tensor);
}

// One input object: exactly name, shape, datatype and data, in any order.
bool TakeAsciiInput(AsciiReader& reader, const char* body_end, size_t body_bytes,
                    InferRequest& request) {
  if (!reader.Take('{')) return false;
  enum : unsigned { kName = 1, kShape = 2, kDatatype = 4, kData = 8 };
  unsigned seen = 0;
  std::string_view name;
  Tensor tensor;
  // The data list, when it came before the shape or the datatype: read once they are known.
  const char* data_later = nullptr;
  do {
    std::string_view key;
    if (!reader.String(&key) || !reader.Take(':')) return false;
    unsigned bit;
    if (key == "name") {
      bit = kName;
      if (!reader.String(&name)) return false;
    } else if (key == "shape") {
      bit = kShape;
      if (!reader.Take('[')) return false;
      if (!reader.Take(']')) {
        tensor.shape.reserve(4);  // one allocation for the usual ranks, not one per dimension
        do {
          AsciiReader::Number extent;
          // Floats and integers past int64 are errors here.
          if (!reader.ReadNumber(&extent) || !extent.integer ||
              (extent.negative && extent.magnitude != 0) ||
              extent.magnitude > static_cast<uint64_t>(INT64_MAX) ||
              tensor.shape.size() >= kMaxRequestRank) {
            return false;
          }
          tensor.shape.push_back(static_cast<int64_t>(extent.magnitude));
        } while (reader.Take(','));
        if (!reader.Take(']')) return false;
      }
    } else if (key == "datatype") {
      bit = kDatatype;
      std::string_view datatype;
      std::optional<DataType> type;
      if (!reader.String(&datatype) || !(type = ParseDataType(datatype))) return false;
      tensor.datatype = *type;
    } else if (key == "data") {
      bit = kData;
      if ((seen & (kShape | kDatatype)) == (kShape | kDatatype)) {
        if (!ReadAsciiTensor(reader, body_bytes, tensor)) return false;
      } else {
        data_later = reader.position();
        if (!reader.SkipList()) return false;
      }
    } else {
      return false;
    }
    if (seen & bit) return false;  // a repeated key: the general decoder decides
    seen |= bit;
  } while (reader.Take(','));
  if (!reader.Take('}') || seen != (kName | kShape | kDatatype | kData) || name.empty()) {
    return false;
  }
  if (data_later != nullptr) {
    AsciiReader data(data_later, body_end);
    if (!ReadAsciiTensor(data, body_bytes, tensor)) return false;
  }
  for (const Tensor& other : request.inputs) {
    if (other.name == name) return false;
  }
  tensor.name = std::string(name);
  request.inputs.push_back(std::move(tensor));
  return true;
}

std::optional<InferRequest> DecodeAscii(std::string_view text) {
  const char* end = text.data() + text.size();
  AsciiReader reader(text.data(), end);
  if (!reader.Take('{')) return std::nullopt;
  enum : unsigned { kId = 1, kInputs = 2, kOutputs = 4 };
  unsigned seen = 0;
  InferRequest request;
  do {
    std::string_view key;
    if (!reader.String(&key) || !reader.Take(':')) return std::nullopt;
    unsigned bit;
    if (key == "id") {
      bit = kId;
      std::string_view id;
      if (!reader.String(&id)) return std::nullopt;
      request.id = std::string(id);
    } else if (key == "inputs") {
      bit = kInputs;
      if (!reader.Take('[')) return std::nullopt;
      do {
        if (!TakeAsciiInput(reader, end, text.size(), request)) return std::nullopt;
      } while (reader.Take(','));
      if (!reader.Take(']')) return std::nullopt;
    } else if (key == "outputs") {
      bit = kOutputs;
      if (!reader.Take('[')) return std::nullopt;
      if (!reader.Take(']')) {
        do {
          std::string_view name_key, name;
          if (!reader.Take('{') || !reader.String(&name_key) || name_key != "name" ||
              !reader.Take(':') || !reader.String(&name) || !reader.Take('}')) {
            return std::nullopt;
          }
          if (std::find(request.requested_outputs.begin(), request.requested_outputs.end(),
                        name) == request.requested_outputs.end()) {
            request.requested_outputs.emplace_back(name);
          }
        } while (reader.Take(','));
        if (!reader.Take(']')) return std::nullopt;
      }
    } else {
      return std::nullopt;
    }
    if (seen & bit) return std::nullopt;
    seen |= bit;
  } while (reader.Take(','));
  if (!reader.Take('}') || !reader.AtEnd() || !(seen & kInputs)) return std::nullopt;
  return request;
}

}  // namespace

std::optional<InferRequest> DecodeAsciiInferRequest(std::string_view text) {
  try {
    return DecodeAscii(text);
  } catch (const std::exception&) {
    return std::nullopt;  // out of memory for a tensor: the general way decides
  }
}

}  // namespace shoal::serve
