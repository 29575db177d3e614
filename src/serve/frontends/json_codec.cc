#include "serve/frontends/json_codec.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <set>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "serve/frontends/common_infer_request.h"

namespace shoal::serve {
namespace {

using json = nlohmann::json;

// Tensor bytes are the machine's order and the binary tensor extension's are little-endian:
// they are copied as they are.
static_assert(std::endian::native == std::endian::little,
              "the binary tensor extension's byte order is little-endian");

// The binary tensor data after the JSON of a request (the binary tensor extension), consumed
// input by input.
struct BinaryTail {
  bool present = false;  // the request had Inference-Header-Content-Length
  size_t json_size = 0;
  std::string_view bytes;
  size_t consumed = 0;
};

// Where a problem is, for messages: "inputs[0] (x)".
std::string InputLabel(size_t index, const std::string& name) {
  return name.empty() ? absl::StrCat("inputs[", index, "]")
                      : absl::StrCat("inputs[", index, "] (", name, ")");
}

// A JSON string literal appended to `out`; invalid UTF-8 is replaced rather than thrown about.
// Names are almost always plain printable ASCII, which needs no escaping and no document.
void AppendQuoted(std::string& out, std::string_view text) {
  bool plain = std::all_of(text.begin(), text.end(), [](char c) {
    return c >= 0x20 && c < 0x7f && c != '"' && c != '\\';
  });
  if (plain) {
    out += '"';
    out += text;
    out += '"';
    return;
  }
  out += json(std::string(text)).dump(-1, ' ', false, json::error_handler_t::replace);
}

const char* JsonTypeName(const json& value) {
  switch (value.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "a list";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    default: return "a value";
  }
}

template <typename T>
void Append(std::vector<std::byte>& out, T value) {
  size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &value, sizeof(T));
}

// One element of `datatype` from `value`, appended to `out`; an error message otherwise.
template <typename T>
std::string AppendInteger(const json& value, std::vector<std::byte>& out) {
  if (value.is_number_unsigned()) {
    uint64_t v = value.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<T>::max())) return "out of range";
    Append(out, static_cast<T>(v));
    return "";
  }
  if (value.is_number_integer()) {
    int64_t v = value.get<int64_t>();
    if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
        (v > 0 && static_cast<uint64_t>(v) > static_cast<uint64_t>(std::numeric_limits<T>::max()))) {
      return "out of range";
    }
    Append(out, static_cast<T>(v));
    return "";
  }
  return "not an integer";
}

std::string AppendElement(DataType type, const json& value, std::vector<std::byte>& out) {
  switch (type) {
    case DataType::kBool:
      if (!value.is_boolean()) return "not true or false";
      Append(out, static_cast<uint8_t>(value.get<bool>() ? 1 : 0));
      return "";
    case DataType::kUint8: return AppendInteger<uint8_t>(value, out);
    case DataType::kInt8: return AppendInteger<int8_t>(value, out);
    case DataType::kInt16: return AppendInteger<int16_t>(value, out);
    case DataType::kInt32: return AppendInteger<int32_t>(value, out);
    case DataType::kInt64: return AppendInteger<int64_t>(value, out);
    case DataType::kFp32: {
      if (!value.is_number()) return "not a number";
      double v = value.get<double>();
      if (std::abs(v) > std::numeric_limits<float>::max()) return "out of range";
      Append(out, static_cast<float>(v));
      return "";
    }
    case DataType::kFp64:
      if (!value.is_number()) return "not a number";
      Append(out, value.get<double>());
      return "";
  }
  return "not supported";
}

// Appends the elements of `data` (flat or nested up to `max_depth` lists) to `out`, counting
// them in `count` and stopping at `limit` (so that a huge body cannot make a huge tensor).
// Returns an error message, or "" when every element converted.
std::string Flatten(const json& data, DataType type, int max_depth, int64_t limit,
                    int64_t& count, std::vector<std::byte>& out) {
  for (const json& element : data) {
    if (element.is_array()) {
      if (max_depth <= 1) return "data is nested deeper than the shape";
      std::string error = Flatten(element, type, max_depth - 1, limit, count, out);
      if (!error.empty()) return error;
      continue;
    }
    if (count >= limit) return "";  // the count check reports it
    std::string error = AppendElement(type, element, out);
    if (!error.empty()) {
      return absl::StrCat("data[", count, "] is ", error, " for ", DataTypeName(type), ": ",
                          element.dump(-1, ' ', false, json::error_handler_t::replace));
    }
    ++count;
  }
  return "";
}

// "" when `data` (a list) is flat, holding no list, or nested exactly as `shape`: a list of
// shape[0] lists of shape[1] ... of shape[rank-1] values. Otherwise what does not match and
// where, e.g. "data[1] has 1 entries, but shape [2,2] needs 2 at dimension 1". Checked before
// the values are converted, so that a tensor whose nesting disagrees with its shape is refused
// rather than read in an order its sender did not mean.
std::string CheckNesting(const json& data, const std::vector<int64_t>& shape) {
  bool flat = std::none_of(data.begin(), data.end(), [](const json& v) { return v.is_array(); });
  if (flat || shape.size() <= 1) return "";  // a flat list; Flatten refuses lists in a rank-1 one
  auto how_to = [&] {
    return absl::StrCat(" (nested data follows the shape; or send the ", ShapeString(shape),
                        " tensor's values flat, in row-major order)");
  };
  std::function<std::string(const json&, size_t, const std::string&)> check =
      [&](const json& level, size_t dimension, const std::string& where) -> std::string {
    if (dimension == shape.size()) {
      if (!level.is_array()) return "";
      return absl::StrCat(where, " is a list, but shape ", ShapeString(shape), " has ",
                          shape.size(), " dimensions: data is nested deeper than the shape",
                          how_to());
    }
    if (!level.is_array()) {
      return absl::StrCat(where, " is ", JsonTypeName(level), ", but shape ", ShapeString(shape),
                          " needs a list of ", shape[dimension], " at dimension ", dimension,
                          how_to());
    }
    if (static_cast<int64_t>(level.size()) != shape[dimension]) {
      return absl::StrCat(where, " has ", level.size(), " entries, but shape ",
                          ShapeString(shape), " needs ", shape[dimension], " at dimension ",
                          dimension, how_to());
    }
    for (size_t i = 0; i < level.size(); ++i) {
      std::string error = check(level[i], dimension + 1, absl::StrCat(where, "[", i, "]"));
      if (!error.empty()) return error;
    }
    return "";
  };
  return check(data, 0, "data");
}

// Counts the elements without converting them (after the limit was hit).
int64_t CountLeaves(const json& data) {
  if (!data.is_array()) return 1;
  int64_t n = 0;
  for (const json& element : data) n += CountLeaves(element);
  return n;
}

// The bytes of an input sent with parameters.binary_data_size `size`, taken from `binary`.
absl::StatusOr<Tensor> TakeBinaryInput(const json& size, bool has_data, const std::string& label,
                                       int64_t elements, BinaryTail* binary, Tensor tensor) {
  if (!size.is_number_integer() || size.get<int64_t>() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": parameters.binary_data_size must be an integer >= 0 (the tensor's size in "
               "bytes), got ",
        size.dump(-1, ' ', false, json::error_handler_t::replace)));
  }
  if (has_data) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": has both 'data' and parameters.binary_data_size; send the tensor one way"));
  }
  if (!binary->present) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": binary_data_size needs the header ", kInferenceHeaderContentLength,
        " (the length of the JSON, which the binary data follows)"));
  }
  uint64_t declared = size.get<uint64_t>();
  size_t element_size = DataTypeSize(tensor.datatype);
  // Compared without multiplying, which could overflow for a huge shape.
  if (declared % element_size != 0 ||
      declared / element_size != static_cast<uint64_t>(elements)) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": binary_data_size is ", declared, ", but shape ", ShapeString(tensor.shape),
        " of ", DataTypeName(tensor.datatype), " is ",
        static_cast<uint64_t>(elements) <= UINT64_MAX / element_size
            ? absl::StrCat(static_cast<uint64_t>(elements) * element_size)
            : std::string("more than 2^64"),
        " bytes"));
  }
  size_t left = binary->bytes.size() - binary->consumed;
  if (declared > left) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": binary_data_size ", declared, " runs past the end of the body: ", left,
        " bytes of binary data are left after the JSON (", binary->json_size,
        " bytes) and the inputs before this one"));
  }
  const std::byte* from =
      reinterpret_cast<const std::byte*>(binary->bytes.data()) + binary->consumed;
  if (tensor.datatype == DataType::kBool) {
    for (uint64_t i = 0; i < declared; ++i) {
      if (from[i] != std::byte{0} && from[i] != std::byte{1}) {
        return absl::InvalidArgumentError(absl::StrCat(
            label, ": BOOL element ", i, " is the byte ", std::to_integer<int>(from[i]),
            "; BOOL elements are one byte, 0 (false) or 1 (true)"));
      }
    }
  }
  tensor.data.assign(from, from + declared);
  binary->consumed += declared;
  return tensor;
}

absl::StatusOr<Tensor> DecodeInput(const json& input, size_t index, BinaryTail* binary) {
  if (!input.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inputs[", index, "] must be an object with name, shape, datatype and data, got ",
        JsonTypeName(input)));
  }
  Tensor tensor;
  auto name = input.find("name");
  if (name == input.end() || !name->is_string() || name->get<std::string>().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("inputs[", index, "]: 'name' is required and must be a non-empty string"));
  }
  tensor.name = name->get<std::string>();
  std::string label = InputLabel(index, tensor.name);

  auto datatype = input.find("datatype");
  if (datatype == input.end() || !datatype->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": 'datatype' is required, one of ", DataTypeNames()));
  }
  std::optional<DataType> type = ParseDataType(datatype->get<std::string>());
  if (!type) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": datatype '", datatype->get<std::string>(),
                                                   "' is not supported; supported: ",
                                                   DataTypeNames()));
  }
  tensor.datatype = *type;

  auto shape = input.find("shape");
  if (shape == input.end() || !shape->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": 'shape' is required, a list of integers >= 0"));
  }
  for (const json& dim : *shape) {
    if (!dim.is_number_integer() || dim.get<int64_t>() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": 'shape' must be a list of integers >= 0, got ",
          shape->dump(-1, ' ', false, json::error_handler_t::replace)));
    }
    tensor.shape.push_back(dim.get<int64_t>());
  }
  if (tensor.shape.size() > kMaxRequestRank) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": shape has ", tensor.shape.size(),
                                                   " dimensions; at most ", kMaxRequestRank));
  }
  std::optional<int64_t> elements = ElementCount(tensor.shape);
  if (!elements) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": shape ", ShapeString(tensor.shape), " is too large"));
  }

  auto parameters = input.find("parameters");
  if (parameters != input.end() && parameters->is_object()) {
    if (auto size = parameters->find("binary_data_size"); size != parameters->end()) {
      return TakeBinaryInput(*size, input.contains("data"), label, *elements, binary,
                             std::move(tensor));
    }
  }
  auto data = input.find("data");
  if (data == input.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": 'data' is required, the tensor's elements in row-major order"));
  }
  int64_t count = 0;
  if (data->is_array()) {
    if (std::string error = CheckNesting(*data, tensor.shape); !error.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(label, ": ", error));
    }
    tensor.data.reserve(static_cast<size_t>(
        std::min<int64_t>(*elements, int64_t{1} << 24) * DataTypeSize(*type)));
    std::string error = Flatten(*data, *type, std::max<int>(1, int(tensor.shape.size())),
                                *elements, count, tensor.data);
    if (!error.empty()) return absl::InvalidArgumentError(absl::StrCat(label, ": ", error));
    if (count == *elements) count = CountLeaves(*data);
  } else {
    // A scalar tensor may give its one value bare.
    std::string error = AppendElement(*type, *data, tensor.data);
    if (!error.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(label, ": 'data' is ", error, " for ",
                                                     DataTypeName(*type), ": ",
                                                     data->dump(-1, ' ', false,
                                                                json::error_handler_t::replace)));
    }
    count = 1;
  }
  if (count != *elements) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": shape ", ShapeString(tensor.shape),
                                                   " needs ", *elements, " values, data has ",
                                                   count));
  }
  return tensor;
}

// The longest text WriteNumber gives: an int64's 20 characters, a double's shortest
// round-trip form ("-2.2250738585072014e-308", 24) or "-Infinity".
constexpr size_t kMaxNumberChars = 24;

// "00" to "99": two digits at a time.
constexpr char kDigitPairs[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

// The decimal digits of `n`, written so that they end just before `end`; returns the first.
template <typename U>
char* WriteDigitsBefore(char* end, U n) {
  while (n >= 100) {
    end -= 2;
    std::memcpy(end, kDigitPairs + 2 * (n % 100), 2);
    n /= 100;
  }
  if (n >= 10) {
    end -= 2;
    std::memcpy(end, kDigitPairs + 2 * n, 2);
  } else {
    *--end = static_cast<char>('0' + n);
  }
  return end;
}

// A finite `value`'s shortest text that reads back as the same value, exactly as fmt's "{}"
// writes it (`json_codec_test` compares the two on random bit patterns): the digits come from
// fmt's Dragonbox, the layout is written here. fmt's own layout code, general enough for every
// format spec, cost twice as much as the digits (docs/design/0005-serving.md).
template <typename T>
char* WriteShortest(char* at, T value) {
  if (std::signbit(value)) {
    *at++ = '-';
    value = -value;
  }
  if (value == 0) {
    *at++ = '0';
    return at;
  }
  // Dragonbox: value = significand * 10^exponent, with the fewest significand digits.
  auto decimal = fmt::detail::dragonbox::to_decimal(value);
  char digits[24];
  char* const digits_end = digits + sizeof(digits);
  const char* first = WriteDigitsBefore(digits_end, decimal.significand);
  const int count = static_cast<int>(digits_end - first);
  const int exponent = decimal.exponent;
  // Where the decimal point goes, counted from the first digit; fmt's rule: plain notation
  // for 1e-4 <= |value| < 1e16, exponent notation (1.5e-05, 1e+16) outside.
  const int point = exponent + count;
  if (point - 1 < -4 || point - 1 >= 16) {
    *at++ = *first;
    if (count > 1) {
      *at++ = '.';
      at = std::copy(first + 1, static_cast<const char*>(digits_end), at);
    }
    *at++ = 'e';
    int e = point - 1;
    *at++ = e < 0 ? '-' : '+';
    if (e < 0) e = -e;
    if (e >= 100) {
      *at++ = static_cast<char>('0' + e / 100);
      e %= 100;
    }
    std::memcpy(at, kDigitPairs + 2 * e, 2);
    return at + 2;
  }
  if (exponent >= 0) {  // 1234e2: 123400
    at = std::copy(first, static_cast<const char*>(digits_end), at);
    return std::fill_n(at, exponent, '0');
  }
  if (point > 0) {  // 1234e-2: 12.34
    at = std::copy_n(first, point, at);
    *at++ = '.';
    return std::copy(first + point, static_cast<const char*>(digits_end), at);
  }
  *at++ = '0';  // 1234e-6: 0.001234
  *at++ = '.';
  at = std::fill_n(at, -point, '0');
  return std::copy(first, static_cast<const char*>(digits_end), at);
}

// `value` written at `at`, which has room for kMaxNumberChars; returns the end. Floating-point
// values take their shortest text that reads back as the same value.
template <typename T>
char* WriteNumber(char* at, T value) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(value)) return std::copy_n("NaN", 3, at);
    if (std::isinf(value)) {
      return value > 0 ? std::copy_n("Infinity", 8, at) : std::copy_n("-Infinity", 9, at);
    }
    return WriteShortest(at, value);
  } else {
    return std::to_chars(at, at + kMaxNumberChars, value).ptr;
  }
}

template <typename T>
void AppendNumber(std::string& out, T value) {
  char buffer[kMaxNumberChars];
  out.append(buffer, WriteNumber(buffer, value));
}

// Elements are written this many at a time into room made for them at their longest, so that
// a large tensor's reply holds at most one block's worth of unused room.
constexpr size_t kElementBlock = 1024;

// The elements, comma-separated, written straight into `out`'s storage: appending them one
// character or number at a time cost as much again as formatting them.
template <typename T>
void WriteElements(std::string& out, const Tensor& tensor) {
  size_t n = tensor.data.size() / sizeof(T);
  for (size_t begin = 0; begin < n; begin += kElementBlock) {
    size_t end = std::min(n, begin + kElementBlock);
    size_t start = out.size();
    out.resize(start + (end - begin) * (kMaxNumberChars + 1));
    char* at = out.data() + start;
    for (size_t i = begin; i < end; ++i) {
      if (i > 0) *at++ = ',';
      T value;
      std::memcpy(&value, tensor.data.data() + i * sizeof(T), sizeof(T));
      if constexpr (std::is_same_v<T, int8_t> || std::is_same_v<T, uint8_t>) {
        at = WriteNumber(at, static_cast<int>(value));
      } else {
        at = WriteNumber(at, value);
      }
    }
    out.resize(static_cast<size_t>(at - out.data()));
  }
}

void WriteData(std::string& out, const Tensor& tensor) {
  out += '[';
  switch (tensor.datatype) {
    case DataType::kBool:
      for (size_t i = 0; i < tensor.data.size(); ++i) {
        if (i > 0) out += ',';
        out += tensor.data[i] != std::byte{0} ? "true" : "false";
      }
      break;
    case DataType::kUint8: WriteElements<uint8_t>(out, tensor); break;
    case DataType::kInt8: WriteElements<int8_t>(out, tensor); break;
    case DataType::kInt16: WriteElements<int16_t>(out, tensor); break;
    case DataType::kInt32: WriteElements<int32_t>(out, tensor); break;
    case DataType::kInt64: WriteElements<int64_t>(out, tensor); break;
    case DataType::kFp32: WriteElements<float>(out, tensor); break;
    case DataType::kFp64: WriteElements<double>(out, tensor); break;
  }
  out += ']';
}

// A boolean parameter (`parameters` an object, or absent); `where` names it for messages.
absl::StatusOr<std::optional<bool>> BoolParameter(const json& object, const char* key,
                                                  const std::string& where) {
  auto parameters = object.find("parameters");
  if (parameters == object.end() || !parameters->is_object()) return std::nullopt;
  auto value = parameters->find(key);
  if (value == parameters->end()) return std::nullopt;
  if (!value->is_boolean()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "parameters.", key, " must be true or false, got ",
        value->dump(-1, ' ', false, json::error_handler_t::replace)));
  }
  return value->get<bool>();
}

absl::StatusOr<InferRequest> DecodeDocument(std::string_view text, BinaryTail* binary) {
  json document;
  try {
    document = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 2: ..." without the tag
    // (out_of_range.406 for a number such as 1e999 that no double holds).
    std::string what = e.what();
    size_t at = what.find("] ");
    return absl::InvalidArgumentError(absl::StrCat(
        "malformed JSON: ", at == std::string::npos ? what : what.substr(at + 2)));
  }
  if (!document.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request must be a JSON object with 'inputs', got ", JsonTypeName(document)));
  }
  InferRequest request;
  if (auto id = document.find("id"); id != document.end()) {
    if (!id->is_string()) return absl::InvalidArgumentError("'id' must be a string");
    request.id = id->get<std::string>();
  }
  auto inputs = document.find("inputs");
  if (inputs == document.end() || !inputs->is_array() || inputs->empty()) {
    return absl::InvalidArgumentError(
        "'inputs' is required: a non-empty list of {name, shape, datatype, data}");
  }
  std::set<std::string> names;
  for (size_t i = 0; i < inputs->size(); ++i) {
    absl::StatusOr<Tensor> tensor = DecodeInput((*inputs)[i], i, binary);
    if (!tensor.ok()) return tensor.status();
    if (!names.insert(tensor->name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(InputLabel(i, tensor->name), ": input '", tensor->name, "' is given twice"));
    }
    request.inputs.push_back(*std::move(tensor));
  }
  if (binary->consumed != binary->bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the body has ", binary->bytes.size(), " bytes after the JSON (", binary->json_size,
        " bytes, ", kInferenceHeaderContentLength, "), but the inputs' binary_data_size add up to ",
        binary->consumed));
  }
  absl::StatusOr<std::optional<bool>> binary_output =
      BoolParameter(document, "binary_data_output", "");
  if (!binary_output.ok()) return binary_output.status();
  request.binary_outputs.by_default = binary_output->value_or(false);
  if (auto outputs = document.find("outputs"); outputs != document.end()) {
    if (!outputs->is_array()) {
      return absl::InvalidArgumentError("'outputs' must be a list of {name}");
    }
    std::set<std::string> seen;
    for (size_t i = 0; i < outputs->size(); ++i) {
      const json& output = (*outputs)[i];
      auto name = output.is_object() ? output.find("name") : output.end();
      if (!output.is_object() || name == output.end() || !name->is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("outputs[", i, "] must be an object with a string 'name'"));
      }
      absl::StatusOr<std::optional<bool>> binary_data = BoolParameter(
          output, "binary_data", absl::StrCat("outputs[", i, "] (", name->get<std::string>(), "): "));
      if (!binary_data.ok()) return binary_data.status();
      if (seen.insert(name->get<std::string>()).second) {
        request.requested_outputs.push_back(name->get<std::string>());
        if (*binary_data) request.binary_outputs.per_output[name->get<std::string>()] = **binary_data;
      }
    }
  }
  return request;
}

}  // namespace

absl::StatusOr<InferRequest> DecodeInferRequest(std::string_view body,
                                                std::optional<std::string_view> json_size_header) {
  if (!json_size_header) {
    if (std::optional<InferRequest> common = DecodeCommonInferRequest(body)) {
      return *std::move(common);
    }
  }
  return DecodeInferRequestThroughDocument(body, json_size_header);
}

absl::StatusOr<InferRequest> DecodeInferRequestThroughDocument(
    std::string_view body, std::optional<std::string_view> json_size_header) {
  BinaryTail binary;
  std::string_view text = body;
  if (json_size_header) {
    uint64_t json_size = 0;
    auto [end, ec] = std::from_chars(json_size_header->data(),
                                     json_size_header->data() + json_size_header->size(), json_size);
    if (ec != std::errc() || end != json_size_header->data() + json_size_header->size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the header ", kInferenceHeaderContentLength,
          " must be the length in bytes of the JSON at the start of the body, an integer; got '",
          std::string(*json_size_header), "'"));
    }
    if (json_size > body.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the header ", kInferenceHeaderContentLength, " says the JSON is ", json_size,
          " bytes, but the body has only ", body.size()));
    }
    binary.present = true;
    binary.json_size = json_size;
    text = body.substr(0, json_size);
    binary.bytes = body.substr(json_size);
  }
  try {
    return DecodeDocument(text, &binary);
  } catch (const json::exception& e) {
    // Not expected: values are only read as the types they were checked to have.
    return absl::InvalidArgumentError(absl::StrCat("cannot read the request: ", e.what()));
  }
}
std::string EncodeInferResponse(std::string_view model_name, int64_t version,
                                std::string_view id, const std::vector<Tensor>& outputs) {
  return EncodeInferResponse(model_name, version, id, outputs, BinaryOutputs{}).body;
}

EncodedInferResponse EncodeInferResponse(std::string_view model_name, int64_t version,
                                         std::string_view id, const std::vector<Tensor>& outputs,
                                         const BinaryOutputs& binary) {
  // A small reply's text never moves while it grows: there is room for its numbers at their
  // longest. A large one's is reserved at a typical length per number (it grows if need be),
  // plus room for the last block at the longest.
  constexpr size_t kTypicalNumberChars = 12;
  size_t size_hint = 128 + model_name.size() + id.size(), binary_size = 0;
  for (const Tensor& t : outputs) {
    if (binary.IsBinary(t.name)) {
      binary_size += t.data.size();
    } else {
      size_t elements = t.data.size() / DataTypeSize(t.datatype);
      size_t longest = std::min(elements, kElementBlock);
      size_hint += 96 + t.name.size() + t.shape.size() * (kMaxNumberChars + 1) +
                   longest * (kMaxNumberChars + 1) + (elements - longest) * kTypicalNumberChars;
    }
  }
  size_hint += binary_size;
  std::string out;
  out.reserve(size_hint);
  out += "{\"model_name\":";
  AppendQuoted(out, model_name);
  out += ",\"model_version\":\"";
  AppendNumber(out, version);
  out += '"';
  if (!id.empty()) {
    out += ",\"id\":";
    AppendQuoted(out, id);
  }
  out += ",\"outputs\":[";
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& t = outputs[i];
    if (i > 0) out += ',';
    out += "{\"name\":";
    AppendQuoted(out, t.name);
    out += ",\"datatype\":\"";
    out += DataTypeName(t.datatype);
    out += "\",\"shape\":[";
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (d > 0) out += ',';
      AppendNumber(out, t.shape[d]);
    }
    out += ']';
    if (binary.IsBinary(t.name)) {
      out += ",\"parameters\":{\"binary_data_size\":";
      AppendNumber(out, t.data.size());
      out += '}';
    } else {
      out += ",\"data\":";
      WriteData(out, t);
    }
    out += '}';
  }
  out += "]}";
  EncodedInferResponse response;
  bool any_binary = false;
  for (const Tensor& t : outputs) any_binary = any_binary || binary.IsBinary(t.name);
  if (any_binary) {
    response.json_size = out.size();
    for (const Tensor& t : outputs) {
      if (binary.IsBinary(t.name)) {
        out.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
      }
    }
  }
  response.body = std::move(out);
  return response;
}

std::string EncodeError(std::string_view message) {
  return json{{"error", std::string(message)}}.dump(-1, ' ', false,
                                                     json::error_handler_t::replace);
}

}  // namespace shoal::serve
