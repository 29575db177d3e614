#include "serve/frontends/grpc_codec.h"

#include <bit>
#include <cstring>
#include <limits>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "inference/grpc_predict_v2.pb.h"

namespace shoal::serve {
namespace {

// Raw tensor contents are little-endian; Tensor bytes are the machine's order.
static_assert(std::endian::native == std::endian::little,
              "raw tensor contents are little-endian");

// Deeper shapes are refused, as the REST codec does.
constexpr size_t kMaxRank = 32;

using InputTensor = inference::ModelInferRequest::InferInputTensor;
using Contents = inference::InferTensorContents;

std::string InputLabel(int index, const std::string& name) {
  return name.empty() ? absl::StrCat("inputs[", index, "]")
                      : absl::StrCat("inputs[", index, "] (", name, ")");
}

// The typed field a datatype's elements travel in.
const char* ContentsField(DataType type) {
  switch (type) {
    case DataType::kBool: return "bool_contents";
    case DataType::kUint8: return "uint_contents";
    case DataType::kInt8:
    case DataType::kInt16:
    case DataType::kInt32: return "int_contents";
    case DataType::kInt64: return "int64_contents";
    case DataType::kFp32: return "fp32_contents";
    case DataType::kFp64: return "fp64_contents";
  }
  return "?";
}

// The fields of `contents` that hold values, with their counts.
std::vector<std::pair<const char*, int>> FilledFields(const Contents& contents) {
  std::vector<std::pair<const char*, int>> filled;
  auto add = [&](const char* field, int count) {
    if (count > 0) filled.emplace_back(field, count);
  };
  add("bool_contents", contents.bool_contents_size());
  add("int_contents", contents.int_contents_size());
  add("int64_contents", contents.int64_contents_size());
  add("uint_contents", contents.uint_contents_size());
  add("uint64_contents", contents.uint64_contents_size());
  add("fp32_contents", contents.fp32_contents_size());
  add("fp64_contents", contents.fp64_contents_size());
  add("bytes_contents", contents.bytes_contents_size());
  return filled;
}

template <typename T, typename Repeated>
void CopyAll(const Repeated& values, std::vector<std::byte>& out) {
  out.resize(static_cast<size_t>(values.size()) * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
}

// Narrows every value to T; an error message naming the first that does not fit.
template <typename T, typename Repeated>
std::string Narrow(const Repeated& values, const char* field, DataType type,
                   std::vector<std::byte>& out) {
  out.resize(static_cast<size_t>(values.size()) * sizeof(T));
  for (int i = 0; i < values.size(); ++i) {
    int64_t value = static_cast<int64_t>(values.Get(i));  // int32 or uint32
    if (value < std::numeric_limits<T>::min() || value > std::numeric_limits<T>::max()) {
      return absl::StrCat("contents.", field, "[", i, "] is out of range for ",
                          DataTypeName(type), ": ", value);
    }
    T narrowed = static_cast<T>(value);
    std::memcpy(out.data() + static_cast<size_t>(i) * sizeof(T), &narrowed, sizeof(T));
  }
  return "";
}

// The elements of `contents` (the field of `type`) as Tensor bytes; an error message otherwise.
std::string TypedElements(const Contents& contents, DataType type, std::vector<std::byte>& out) {
  switch (type) {
    case DataType::kBool:
      out.resize(contents.bool_contents_size());
      for (int i = 0; i < contents.bool_contents_size(); ++i) {
        out[i] = std::byte{contents.bool_contents(i) ? uint8_t{1} : uint8_t{0}};
      }
      return "";
    case DataType::kUint8:
      return Narrow<uint8_t>(contents.uint_contents(), "uint_contents", type, out);
    case DataType::kInt8: return Narrow<int8_t>(contents.int_contents(), "int_contents", type, out);
    case DataType::kInt16:
      return Narrow<int16_t>(contents.int_contents(), "int_contents", type, out);
    case DataType::kInt32: CopyAll<int32_t>(contents.int_contents(), out); return "";
    case DataType::kInt64: CopyAll<int64_t>(contents.int64_contents(), out); return "";
    case DataType::kFp32: CopyAll<float>(contents.fp32_contents(), out); return "";
    case DataType::kFp64: CopyAll<double>(contents.fp64_contents(), out); return "";
  }
  return "not supported";
}

absl::StatusOr<Tensor> DecodeInput(const InputTensor& input, int index, const std::string* raw) {
  if (input.name().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("inputs[", index, "]: 'name' is required and must be a non-empty string"));
  }
  Tensor tensor;
  tensor.name = input.name();
  std::string label = InputLabel(index, tensor.name);
  std::optional<DataType> type = ParseDataType(input.datatype());
  if (!type) {
    if (input.datatype().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(label, ": 'datatype' is required, one of ", DataTypeNames()));
    }
    return absl::InvalidArgumentError(absl::StrCat(label, ": datatype '", input.datatype(),
                                                   "' is not supported; supported: ",
                                                   DataTypeNames()));
  }
  tensor.datatype = *type;
  if (static_cast<size_t>(input.shape_size()) > kMaxRank) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": shape has ", input.shape_size(),
                                                   " dimensions; at most ", kMaxRank));
  }
  tensor.shape.assign(input.shape().begin(), input.shape().end());
  for (int64_t dim : tensor.shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": 'shape' must be a list of integers >= 0, got ", ShapeString(tensor.shape)));
    }
  }
  std::optional<int64_t> elements = ElementCount(tensor.shape);
  if (!elements) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": shape ", ShapeString(tensor.shape), " is too large"));
  }
  size_t element_size = DataTypeSize(*type);
  std::vector<std::pair<const char*, int>> filled = FilledFields(input.contents());

  if (raw != nullptr) {
    if (!filled.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": has contents.", filled[0].first,
          ", but the request sends its tensors in raw_input_contents; send every input one way"));
    }
    // Compared without multiplying, which could overflow for a huge shape.
    if (raw->size() % element_size != 0 ||
        raw->size() / element_size != static_cast<uint64_t>(*elements)) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": raw_input_contents[", index, "] has ", raw->size(), " bytes, but shape ",
          ShapeString(tensor.shape), " of ", DataTypeName(*type), " needs ",
          static_cast<uint64_t>(*elements) <= UINT64_MAX / element_size
              ? absl::StrCat(static_cast<uint64_t>(*elements) * element_size)
              : std::string("more than 2^64")));
    }
    const std::byte* from = reinterpret_cast<const std::byte*>(raw->data());
    if (*type == DataType::kBool) {
      for (size_t i = 0; i < raw->size(); ++i) {
        if (from[i] != std::byte{0} && from[i] != std::byte{1}) {
          return absl::InvalidArgumentError(absl::StrCat(
              label, ": BOOL element ", i, " is the byte ", std::to_integer<int>(from[i]),
              "; BOOL elements are one byte, 0 (false) or 1 (true)"));
        }
      }
    }
    tensor.data.assign(from, from + raw->size());
    return tensor;
  }

  const char* field = ContentsField(*type);
  for (const auto& [other, count] : filled) {
    if (std::string_view(other) != field) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": ", DataTypeName(*type), " values go in contents.", field, "; got ", count,
          " in contents.", other));
    }
  }
  int count = filled.empty() ? 0 : filled[0].second;
  if (count != *elements) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": shape ", ShapeString(tensor.shape),
                                                   " needs ", *elements, " values, contents.",
                                                   field, " has ", count));
  }
  std::string error = TypedElements(input.contents(), *type, tensor.data);
  if (!error.empty()) return absl::InvalidArgumentError(absl::StrCat(label, ": ", error));
  return tensor;
}

template <typename T, typename Repeated>
void AddAll(const Tensor& tensor, Repeated* out) {
  size_t n = tensor.data.size() / sizeof(T);
  out->Reserve(static_cast<int>(n));
  for (size_t i = 0; i < n; ++i) {
    T value;
    std::memcpy(&value, tensor.data.data() + i * sizeof(T), sizeof(T));
    out->Add(value);
  }
}

void EncodeTyped(const Tensor& tensor, Contents* contents) {
  switch (tensor.datatype) {
    case DataType::kBool:
      for (std::byte b : tensor.data) contents->add_bool_contents(b != std::byte{0});
      break;
    case DataType::kUint8: AddAll<uint8_t>(tensor, contents->mutable_uint_contents()); break;
    case DataType::kInt8: AddAll<int8_t>(tensor, contents->mutable_int_contents()); break;
    case DataType::kInt16: AddAll<int16_t>(tensor, contents->mutable_int_contents()); break;
    case DataType::kInt32: AddAll<int32_t>(tensor, contents->mutable_int_contents()); break;
    case DataType::kInt64: AddAll<int64_t>(tensor, contents->mutable_int64_contents()); break;
    case DataType::kFp32: AddAll<float>(tensor, contents->mutable_fp32_contents()); break;
    case DataType::kFp64: AddAll<double>(tensor, contents->mutable_fp64_contents()); break;
  }
}

}  // namespace

absl::StatusOr<InferRequest> DecodeModelInferRequest(const inference::ModelInferRequest& request) {
  InferRequest decoded;
  decoded.id = request.id();
  if (request.inputs_size() == 0) {
    return absl::InvalidArgumentError(
        "'inputs' is required: a non-empty list of {name, shape, datatype, contents}");
  }
  bool raw = request.raw_input_contents_size() > 0;
  if (raw && request.raw_input_contents_size() != request.inputs_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "raw_input_contents has ", request.raw_input_contents_size(), " entries for ",
        request.inputs_size(), " inputs; give one per input, in the order of 'inputs'"));
  }
  std::set<std::string> names;
  for (int i = 0; i < request.inputs_size(); ++i) {
    absl::StatusOr<Tensor> tensor =
        DecodeInput(request.inputs(i), i, raw ? &request.raw_input_contents(i) : nullptr);
    if (!tensor.ok()) return tensor.status();
    if (!names.insert(tensor->name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          InputLabel(i, tensor->name), ": input '", tensor->name, "' is given twice"));
    }
    decoded.inputs.push_back(*std::move(tensor));
  }
  std::set<std::string> seen;
  for (int i = 0; i < request.outputs_size(); ++i) {
    const std::string& name = request.outputs(i).name();
    if (name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("outputs[", i, "] must have a non-empty 'name'"));
    }
    if (seen.insert(name).second) decoded.requested_outputs.push_back(name);
  }
  return decoded;
}

void EncodeModelInferResponse(std::string_view model_name, int64_t version, std::string_view id,
                              const std::vector<Tensor>& outputs, bool raw,
                              inference::ModelInferResponse* response) {
  response->set_model_name(std::string(model_name));
  response->set_model_version(absl::StrCat(version));
  response->set_id(std::string(id));
  for (const Tensor& tensor : outputs) {
    auto* output = response->add_outputs();
    output->set_name(tensor.name);
    output->set_datatype(DataTypeName(tensor.datatype));
    for (int64_t dim : tensor.shape) output->add_shape(dim);
    if (raw) {
      response->add_raw_output_contents()->assign(
          reinterpret_cast<const char*>(tensor.data.data()), tensor.data.size());
    } else {
      EncodeTyped(tensor, output->mutable_contents());
    }
  }
}

}  // namespace shoal::serve
