#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "serve/core/tensor.h"

namespace shoal::serve {

// How an ensemble turns its members' outputs into one (docs/serving.md, "Ensembles").
enum class Combiner {
  kMean,           // elementwise arithmetic mean
  kGeometricMean,  // elementwise (x1 * ... * xn)^(1/n); values must be >= 0
  kHarmonicMean,   // elementwise n / (1/x1 + ... + 1/xn), 0 when any is 0; values must be >= 0
  kMedian,         // elementwise; the mean of the two middle values for an even count
  kVote,           // argmax of each row (the last dimension holds the classes) per member, then
                   // the class most members chose; a tie goes to the smallest class index
};

// "mean", "geometric_mean", "harmonic_mean", "median", "vote".
const char* CombinerName(Combiner combiner);
std::optional<Combiner> ParseCombiner(std::string_view name);
// "mean, geometric_mean, ...", for messages.
std::string CombinerNames();

// Whether `combiner` takes outputs of `type`: the means and the median take FP32 and FP64 (and
// keep it), the vote any numeric datatype but BOOL.
bool CombinerAccepts(Combiner combiner, DataType type);

// The output the datatype and shape of the members' `output` combine to: the same for the
// means and the median; INT64 with the last dimension dropped for the vote ([1] for a 1-D
// output). -1 dimensions stay -1.
std::vector<int64_t> CombinedShape(Combiner combiner, const std::vector<int64_t>& shape);
DataType CombinedDataType(Combiner combiner, DataType type);

// Combines one output of every member (`outputs[i]` is member i's; at least one), named as the
// first. Internal when they differ in datatype or shape or the datatype is not accepted, and
// for a negative value under the geometric or harmonic mean; each message says which member
// and element.
absl::StatusOr<Tensor> CombineOutputs(Combiner combiner,
                                      const std::vector<const Tensor*>& outputs);

}  // namespace shoal::serve
