#include "serve/frontends/common_infer_request.h"

#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "serve/frontends/ascii_infer_request.h"

namespace shoal::serve {
namespace {

namespace dom = simdjson::dom;

// Bodies up to this size are parsed by a parser kept per thread, which keeps its buffers
// between requests; larger ones by their own, so that one huge body leaves no huge buffers.
constexpr size_t kReusedParserBytes = size_t{1} << 20;

template <typename T>
void Store(std::byte* out, T value) {
  std::memcpy(out, &value, sizeof(T));
}

// One integer of T's range, as the general decoder converts it; false otherwise.
template <typename T>
bool StoreInteger(dom::element value, std::byte* out) {
  switch (value.type()) {
    case dom::element_type::INT64: {
      int64_t v = int64_t(value);
      if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
          (v > 0 && static_cast<uint64_t>(v) > static_cast<uint64_t>(std::numeric_limits<T>::max()))) {
        return false;
      }
      Store(out, static_cast<T>(v));
      return true;
    }
    case dom::element_type::UINT64: {
      uint64_t v = uint64_t(value);
      if (v > static_cast<uint64_t>(std::numeric_limits<T>::max())) return false;
      Store(out, static_cast<T>(v));
      return true;
    }
    default: return false;
  }
}

bool AsDouble(dom::element value, double* out) {
  switch (value.type()) {
    case dom::element_type::INT64: *out = static_cast<double>(int64_t(value)); return true;
    case dom::element_type::UINT64: *out = static_cast<double>(uint64_t(value)); return true;
    case dom::element_type::DOUBLE: *out = double(value); return true;
    default: return false;
  }
}

bool StoreElement(DataType type, dom::element value, std::byte* out) {
  switch (type) {
    case DataType::kBool:
      if (value.type() != dom::element_type::BOOL) return false;
      Store(out, static_cast<uint8_t>(bool(value) ? 1 : 0));
      return true;
    case DataType::kUint8: return StoreInteger<uint8_t>(value, out);
    case DataType::kInt8: return StoreInteger<int8_t>(value, out);
    case DataType::kInt16: return StoreInteger<int16_t>(value, out);
    case DataType::kInt32: return StoreInteger<int32_t>(value, out);
    case DataType::kInt64: return StoreInteger<int64_t>(value, out);
    case DataType::kFp32: {
      double v;
      if (!AsDouble(value, &v) || std::abs(v) > std::numeric_limits<float>::max()) return false;
      Store(out, static_cast<float>(v));
      return true;
    }
    case DataType::kFp64: {
      double v;
      if (!AsDouble(value, &v)) return false;
      Store(out, v);
      return true;
    }
  }
  return false;
}

// Converts the values of the flat list `data` into `tensor`, which has room for exactly its
// shape's elements; false when a value is a list, there are more, or one does not convert.
bool StoreFlat(dom::array data, Tensor& tensor, size_t& count) {
  const size_t element_size = DataTypeSize(tensor.datatype);
  const size_t capacity = tensor.data.size() / element_size;
  for (dom::element value : data) {
    if (count >= capacity) return false;
    if (!StoreElement(tensor.datatype, value, tensor.data.data() + count * element_size)) {
      return false;
    }
    ++count;
  }
  return true;
}

// Converts `data`, nested as tensor.shape from `dimension` on (a list of shape[dimension]
// lists of ...), into `tensor`; false when its nesting does not follow the shape or a value
// does not convert.
bool StoreNested(dom::array data, size_t dimension, Tensor& tensor, size_t& count) {
  if (static_cast<int64_t>(data.size()) != tensor.shape[dimension]) return false;
  if (dimension + 1 == tensor.shape.size()) return StoreFlat(data, tensor, count);
  for (dom::element value : data) {
    dom::array inner;
    if (value.get_array().get(inner) || !StoreNested(inner, dimension + 1, tensor, count)) {
      return false;
    }
  }
  return true;
}

// `data` flat (no value a list; a list there fails StoreElement) or nested exactly as the
// shape; the general decoder words what is wrong with any other.
bool StoreData(dom::array data, Tensor& tensor, size_t& count) {
  bool nested = false;
  for (dom::element value : data) {
    nested = value.type() == dom::element_type::ARRAY;
    break;
  }
  if (nested && tensor.shape.size() >= 2) return StoreNested(data, 0, tensor, count);
  return StoreFlat(data, tensor, count);
}

bool TakeInput(dom::element element, size_t body_bytes, InferRequest& request) {
  dom::object input;
  if (element.get_object().get(input)) return false;
  enum : unsigned { kName = 1, kShape = 2, kDatatype = 4, kData = 8 };
  unsigned seen = 0;
  std::string_view name, datatype;
  dom::array shape, data;
  for (dom::key_value_pair field : input) {
    unsigned bit;
    simdjson::error_code error;
    if (field.key == "name") {
      bit = kName;
      error = field.value.get_string().get(name);
    } else if (field.key == "shape") {
      bit = kShape;
      error = field.value.get_array().get(shape);
    } else if (field.key == "datatype") {
      bit = kDatatype;
      error = field.value.get_string().get(datatype);
    } else if (field.key == "data") {
      bit = kData;
      error = field.value.get_array().get(data);
    } else {
      return false;
    }
    if (error || (seen & bit)) return false;  // a repeated key too: the general decoder decides
    seen |= bit;
  }
  if (seen != (kName | kShape | kDatatype | kData) || name.empty()) return false;
  std::optional<DataType> type = ParseDataType(datatype);
  if (!type) return false;
  for (const Tensor& other : request.inputs) {
    if (other.name == name) return false;
  }
  Tensor tensor;
  tensor.name = std::string(name);
  tensor.datatype = *type;
  tensor.shape.reserve(shape.size());
  for (dom::element dim : shape) {
    int64_t extent;
    // Floats and integers past int64 are errors here.
    if (dim.get_int64().get(extent) || extent < 0) return false;
    tensor.shape.push_back(extent);
  }
  if (tensor.shape.size() > kMaxRequestRank) return false;
  std::optional<int64_t> elements = ElementCount(tensor.shape);
  // A body holds fewer values than bytes: a larger shape is an error, so nothing is allocated.
  if (!elements || static_cast<uint64_t>(*elements) > body_bytes) return false;
  tensor.data.resize(static_cast<size_t>(*elements) * DataTypeSize(*type));
  size_t count = 0;
  if (!StoreData(data, tensor, count) ||
      count != static_cast<size_t>(*elements)) {
    return false;
  }
  request.inputs.push_back(std::move(tensor));
  return true;
}

bool TakeOutputs(dom::array outputs, InferRequest& request) {
  for (dom::element element : outputs) {
    dom::object output;
    if (element.get_object().get(output) || output.size() != 1) return false;
    std::string_view name;
    if (output.at_key("name").get_string().get(name)) return false;
    if (std::find(request.requested_outputs.begin(), request.requested_outputs.end(), name) ==
        request.requested_outputs.end()) {
      request.requested_outputs.emplace_back(name);
    }
  }
  return true;
}

std::optional<InferRequest> Decode(dom::parser& parser, std::string_view text) {
  dom::object top;
  if (parser.parse(text.data(), text.size()).get_object().get(top)) return std::nullopt;
  enum : unsigned { kId = 1, kInputs = 2, kOutputs = 4 };
  unsigned seen = 0;
  InferRequest request;
  for (dom::key_value_pair field : top) {
    unsigned bit;
    if (field.key == "id") {
      bit = kId;
      std::string_view id;
      if (field.value.get_string().get(id)) return std::nullopt;
      request.id = std::string(id);
    } else if (field.key == "inputs") {
      bit = kInputs;
      dom::array inputs;
      if (field.value.get_array().get(inputs) || inputs.size() == 0) return std::nullopt;
      for (dom::element input : inputs) {
        if (!TakeInput(input, text.size(), request)) return std::nullopt;
      }
    } else if (field.key == "outputs") {
      bit = kOutputs;
      dom::array outputs;
      if (field.value.get_array().get(outputs) || !TakeOutputs(outputs, request)) {
        return std::nullopt;
      }
    } else {
      return std::nullopt;
    }
    if (seen & bit) return std::nullopt;
    seen |= bit;
  }
  if (!(seen & kInputs)) return std::nullopt;
  return request;
}

}  // namespace

std::optional<InferRequest> DecodeCommonInferRequest(std::string_view text) {
  if (std::optional<InferRequest> request = DecodeAsciiInferRequest(text)) return request;
  try {
    if (text.size() <= kReusedParserBytes) {
      thread_local dom::parser parser;
      return Decode(parser, text);
    }
    dom::parser parser;
    return Decode(parser, text);
  } catch (const std::exception&) {
    return std::nullopt;  // out of memory for the parser's buffers: the general way decides
  }
}

}  // namespace shoal::serve
