#pragma once

// Tensors as the server moves them: named, typed, row-major bytes. Standard C++ only, because
// this header is shared with the TorchScript runtime module (model_backend.h), which is built
// and loaded separately and must agree with the server on these types without libtorch or
// abseil in between.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace shoal::serve {

// The KServe v2 datatypes a TorchScript tensor can hold. FP16, BF16, unsigned types wider
// than 8 bits and BYTES (strings) are not served yet.
enum class DataType { kBool, kUint8, kInt8, kInt16, kInt32, kInt64, kFp32, kFp64 };

inline constexpr DataType kAllDataTypes[] = {DataType::kBool,  DataType::kUint8, DataType::kInt8,
                                             DataType::kInt16, DataType::kInt32, DataType::kInt64,
                                             DataType::kFp32,  DataType::kFp64};

// The KServe v2 name: "BOOL", "UINT8", ..., "FP32", "FP64".
inline const char* DataTypeName(DataType type) {
  switch (type) {
    case DataType::kBool: return "BOOL";
    case DataType::kUint8: return "UINT8";
    case DataType::kInt8: return "INT8";
    case DataType::kInt16: return "INT16";
    case DataType::kInt32: return "INT32";
    case DataType::kInt64: return "INT64";
    case DataType::kFp32: return "FP32";
    case DataType::kFp64: return "FP64";
  }
  return "?";
}

// Bytes per element (BOOL is one byte, as in torch.bool).
inline size_t DataTypeSize(DataType type) {
  switch (type) {
    case DataType::kBool:
    case DataType::kUint8:
    case DataType::kInt8: return 1;
    case DataType::kInt16: return 2;
    case DataType::kInt32:
    case DataType::kFp32: return 4;
    case DataType::kInt64:
    case DataType::kFp64: return 8;
  }
  return 1;
}

// The datatype a KServe v2 name denotes, exactly as spelled (upper case); nullopt otherwise.
inline std::optional<DataType> ParseDataType(std::string_view name) {
  for (DataType type : kAllDataTypes) {
    if (std::string_view(DataTypeName(type)) == name) return type;
  }
  return std::nullopt;
}

// "BOOL, UINT8, ..., FP64", for messages.
inline std::string DataTypeNames() {
  std::string names;
  for (DataType type : kAllDataTypes) {
    if (!names.empty()) names += ", ";
    names += DataTypeName(type);
  }
  return names;
}

// A dense tensor in row-major order. `data` holds exactly ElementCount(shape) elements of
// `datatype` in the machine's byte order.
struct Tensor {
  std::string name;
  DataType datatype = DataType::kFp32;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;
};

// The number of elements of a tensor of `shape` (1 for a scalar); nullopt when a dimension is
// negative or the product overflows int64.
inline std::optional<int64_t> ElementCount(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0) return std::nullopt;
    if (dim != 0 && count > INT64_MAX / dim) return std::nullopt;
    count *= dim;
  }
  return count;
}

// "[2,3]", for messages.
inline std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ",";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

}  // namespace shoal::serve
