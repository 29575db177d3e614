#include "serve/repository/ensemble_combiner.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace shoal::serve {
namespace {

constexpr Combiner kAllCombiners[] = {Combiner::kMean, Combiner::kGeometricMean,
                                      Combiner::kHarmonicMean, Combiner::kMedian,
                                      Combiner::kVote};

template <typename T>
double Read(const std::byte* data, int64_t i) {
  T value;
  std::memcpy(&value, data + i * sizeof(T), sizeof(T));
  return static_cast<double>(value);
}

double ElementAt(const Tensor& t, int64_t i) {
  const std::byte* d = t.data.data();
  switch (t.datatype) {
    case DataType::kBool:
    case DataType::kUint8: return Read<uint8_t>(d, i);
    case DataType::kInt8: return Read<int8_t>(d, i);
    case DataType::kInt16: return Read<int16_t>(d, i);
    case DataType::kInt32: return Read<int32_t>(d, i);
    case DataType::kInt64: return Read<int64_t>(d, i);
    case DataType::kFp32: return Read<float>(d, i);
    case DataType::kFp64: return Read<double>(d, i);
  }
  return 0;
}

template <typename T>
void Write(std::vector<std::byte>& data, int64_t i, T value) {
  std::memcpy(data.data() + i * sizeof(T), &value, sizeof(T));
}

}  // namespace

const char* CombinerName(Combiner combiner) {
  switch (combiner) {
    case Combiner::kMean: return "mean";
    case Combiner::kGeometricMean: return "geometric_mean";
    case Combiner::kHarmonicMean: return "harmonic_mean";
    case Combiner::kMedian: return "median";
    case Combiner::kVote: return "vote";
  }
  return "?";
}

std::optional<Combiner> ParseCombiner(std::string_view name) {
  for (Combiner c : kAllCombiners) {
    if (name == CombinerName(c)) return c;
  }
  return std::nullopt;
}

std::string CombinerNames() {
  std::string names;
  for (Combiner c : kAllCombiners) {
    absl::StrAppend(&names, names.empty() ? "" : ", ", CombinerName(c));
  }
  return names;
}

bool CombinerAccepts(Combiner combiner, DataType type) {
  if (combiner == Combiner::kVote) return type != DataType::kBool;
  return type == DataType::kFp32 || type == DataType::kFp64;
}

std::vector<int64_t> CombinedShape(Combiner combiner, const std::vector<int64_t>& shape) {
  if (combiner != Combiner::kVote) return shape;
  if (shape.size() <= 1) return {1};
  return std::vector<int64_t>(shape.begin(), shape.end() - 1);
}

DataType CombinedDataType(Combiner combiner, DataType type) {
  return combiner == Combiner::kVote ? DataType::kInt64 : type;
}

absl::StatusOr<Tensor> CombineOutputs(Combiner combiner,
                                      const std::vector<const Tensor*>& outputs) {
  if (outputs.empty()) return absl::InternalError("an ensemble without members");
  const Tensor& first = *outputs.front();
  for (size_t m = 1; m < outputs.size(); ++m) {
    if (outputs[m]->datatype != first.datatype || outputs[m]->shape != first.shape) {
      return absl::InternalError(absl::StrCat(
          "output '", first.name, "': member ", m + 1, " returned ",
          DataTypeName(outputs[m]->datatype), " ", ShapeString(outputs[m]->shape), ", member 1 ",
          DataTypeName(first.datatype), " ", ShapeString(first.shape), "; ",
          CombinerName(combiner), " needs the same from every member"));
    }
  }
  if (!CombinerAccepts(combiner, first.datatype)) {
    return absl::InternalError(absl::StrCat("output '", first.name, "' is ",
                                            DataTypeName(first.datatype), ", which ",
                                            CombinerName(combiner), " does not combine"));
  }
  int64_t count = ElementCount(first.shape).value_or(0);
  const size_t n = outputs.size();
  Tensor combined;
  combined.name = first.name;
  combined.datatype = CombinedDataType(combiner, first.datatype);
  combined.shape = CombinedShape(combiner, first.shape);

  if (combiner == Combiner::kVote) {
    int64_t classes = first.shape.empty() ? 1 : first.shape.back();
    int64_t rows = classes > 0 ? count / classes : 0;
    combined.data.resize(static_cast<size_t>(std::max<int64_t>(rows, 0)) * sizeof(int64_t));
    std::vector<int64_t> votes(static_cast<size_t>(std::max<int64_t>(classes, 1)));
    for (int64_t r = 0; r < rows; ++r) {
      std::fill(votes.begin(), votes.end(), 0);
      for (const Tensor* t : outputs) {
        int64_t best = 0;  // the first of equal maxima, as torch.argmax
        for (int64_t c = 1; c < classes; ++c) {
          if (ElementAt(*t, r * classes + c) > ElementAt(*t, r * classes + best)) best = c;
        }
        votes[best] += 1;
      }
      int64_t winner = std::max_element(votes.begin(), votes.end()) - votes.begin();
      Write<int64_t>(combined.data, r, winner);
    }
    return combined;
  }

  combined.data.resize(static_cast<size_t>(count) * DataTypeSize(combined.datatype));
  std::vector<double> values(n);
  for (int64_t i = 0; i < count; ++i) {
    for (size_t m = 0; m < n; ++m) {
      values[m] = ElementAt(*outputs[m], i);
      if ((combiner == Combiner::kGeometricMean || combiner == Combiner::kHarmonicMean) &&
          values[m] < 0) {
        return absl::InternalError(absl::StrCat(
            "output '", first.name, "': member ", m + 1, " returned ", values[m],
            " at element ", i, "; ", CombinerName(combiner), " needs values >= 0"));
      }
    }
    double result = 0;
    switch (combiner) {
      case Combiner::kMean: {
        for (double v : values) result += v;
        result /= static_cast<double>(n);
        break;
      }
      case Combiner::kGeometricMean: {
        bool zero = std::any_of(values.begin(), values.end(), [](double v) { return v == 0; });
        if (!zero) {
          double logs = 0;
          for (double v : values) logs += std::log(v);
          result = std::exp(logs / static_cast<double>(n));
        }
        break;
      }
      case Combiner::kHarmonicMean: {
        bool zero = std::any_of(values.begin(), values.end(), [](double v) { return v == 0; });
        if (!zero) {
          double inverses = 0;
          for (double v : values) inverses += 1.0 / v;
          result = static_cast<double>(n) / inverses;
        }
        break;
      }
      case Combiner::kMedian: {
        std::vector<double> sorted = values;
        std::sort(sorted.begin(), sorted.end());
        result = n % 2 == 1 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0;
        break;
      }
      case Combiner::kVote: break;
    }
    if (combined.datatype == DataType::kFp32) {
      Write<float>(combined.data, i, static_cast<float>(result));
    } else {
      Write<double>(combined.data, i, result);
    }
  }
  return combined;
}

}  // namespace shoal::serve
