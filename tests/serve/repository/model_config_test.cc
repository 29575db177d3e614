#include "serve/repository/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace shoal::serve {
namespace {

using ::testing::HasSubstr;

constexpr char kSource[] = "models/mlp/config.yaml";

ModelConfig ParseOk(const std::string& yaml) {
  absl::StatusOr<ModelConfig> config = ParseModelConfig(yaml, kSource);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : ModelConfig{};
}

// The whole message of a refused config.
std::string ParseError(const std::string& yaml) {
  absl::StatusOr<ModelConfig> config = ParseModelConfig(yaml, kSource);
  EXPECT_FALSE(config.ok()) << "accepted:\n" << yaml;
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(config.status().message());
}

TEST(ModelConfigTest, EmptyFileMeansEveryDefault) {
  ModelConfig config = ParseOk("");
  EXPECT_TRUE(config.inputs.empty());
  EXPECT_TRUE(config.outputs.empty());
  EXPECT_EQ(config.max_batch_size, 0);
  EXPECT_EQ(config.batch_delay_us, 0);
  EXPECT_EQ(config.instances, 1);
  EXPECT_FALSE(config.threads_per_instance.has_value());
  EXPECT_TRUE(config.warmup.empty());
}

TEST(ModelConfigTest, ParsesEveryKey) {
  ModelConfig config = ParseOk(R"(
inputs:
  - {name: x, datatype: FP32, dims: [16]}
  - name: mask
    datatype: BOOL
    dims: [-1]
outputs:
  - {name: y, datatype: INT64, dims: [4]}
max_batch_size: 8
batch_delay_us: 500
instances: 2
threads_per_instance: 3
warmup:
  - count: 2
    inputs:
      x: {dims: [8, 16], fill: random}
      mask: {dims: [1, 5], fill: one}
  - inputs:
      x: {dims: [1, 16]}
      mask: {dims: [1, 1]}
)");
  ASSERT_EQ(config.inputs.size(), 2u);
  EXPECT_EQ(config.inputs[0].name, "x");
  EXPECT_EQ(config.inputs[0].datatype, DataType::kFp32);
  EXPECT_EQ(config.inputs[0].dims, (std::vector<int64_t>{16}));
  EXPECT_EQ(config.inputs[1].name, "mask");
  EXPECT_EQ(config.inputs[1].datatype, DataType::kBool);
  EXPECT_EQ(config.inputs[1].dims, (std::vector<int64_t>{-1}));
  ASSERT_EQ(config.outputs.size(), 1u);
  EXPECT_EQ(config.outputs[0].datatype, DataType::kInt64);
  EXPECT_EQ(config.max_batch_size, 8);
  EXPECT_EQ(config.batch_delay_us, 500);
  EXPECT_EQ(config.instances, 2);
  EXPECT_EQ(config.threads_per_instance, 3);
  ASSERT_EQ(config.warmup.size(), 2u);
  EXPECT_EQ(config.warmup[0].count, 2);
  ASSERT_EQ(config.warmup[0].inputs.size(), 2u);
  // In the declared order, whatever the order in the warmup entry.
  EXPECT_EQ(config.warmup[0].inputs[0].name, "x");
  EXPECT_EQ(config.warmup[0].inputs[0].shape, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(config.warmup[0].inputs[0].fill, WarmupFill::kRandom);
  EXPECT_EQ(config.warmup[0].inputs[1].fill, WarmupFill::kOne);
  EXPECT_EQ(config.warmup[1].count, 1);
  EXPECT_EQ(config.warmup[1].inputs[0].fill, WarmupFill::kZero);
}

TEST(ModelConfigTest, AcceptsEveryKServeDatatypeName) {
  for (DataType type : kAllDataTypes) {
    ModelConfig config = ParseOk(std::string("inputs: [{name: x, datatype: ") +
                                 DataTypeName(type) + ", dims: [1]}]");
    ASSERT_EQ(config.inputs.size(), 1u);
    EXPECT_EQ(config.inputs[0].datatype, type);
  }
}

TEST(ModelConfigTest, RefusesInvalidYamlWithLineAndColumn) {
  EXPECT_THAT(ParseError("max_batch_size: 4\ninputs: [\n"),
              HasSubstr("models/mlp/config.yaml:3:1: invalid YAML:"));
}

TEST(ModelConfigTest, RefusesATopLevelThatIsNotAMap) {
  EXPECT_EQ(ParseError("- 1\n- 2\n"),
            "models/mlp/config.yaml:1: a model config must be a map of inputs, outputs, "
            "max_batch_size, batch_delay_us, instances, threads_per_instance, warmup, version_policy, ensemble, rollout; got a list");
}

TEST(ModelConfigTest, RefusesUnknownKeysListingTheAcceptedOnes) {
  EXPECT_EQ(ParseError("instances: 1\nmax_batch: 4\n"),
            "models/mlp/config.yaml:2: max_batch: unknown key; accepted keys: inputs, outputs, "
            "max_batch_size, batch_delay_us, instances, threads_per_instance, warmup, version_policy, ensemble, rollout");
}

TEST(ModelConfigTest, RefusesAKeyGivenTwice) {
  EXPECT_EQ(ParseError("instances: 1\ninstances: 2\n"),
            "models/mlp/config.yaml:2: instances: given twice, at lines 1 and 2; keep one");
}

TEST(ModelConfigTest, RefusesIntegersOutOfRangeOrOfTheWrongType) {
  EXPECT_EQ(ParseError("max_batch_size: -1\n"),
            "models/mlp/config.yaml:1: max_batch_size: must be an integer >= 0, got -1");
  EXPECT_EQ(ParseError("max_batch_size: 99999999\n"),
            "models/mlp/config.yaml:1: max_batch_size: must be at most 1048576, got 99999999");
  EXPECT_EQ(ParseError("instances: 0\n"),
            "models/mlp/config.yaml:1: instances: must be an integer >= 1, got 0");
  EXPECT_EQ(ParseError("instances: two\n"),
            "models/mlp/config.yaml:1: instances: must be an integer >= 1, got 'two'");
  EXPECT_EQ(ParseError("instances: \"2\"\n"),
            "models/mlp/config.yaml:1: instances: must be an integer >= 1, got '2'");
  EXPECT_EQ(ParseError("threads_per_instance: 0\n"),
            "models/mlp/config.yaml:1: threads_per_instance: must be an integer >= 1, got 0");
  EXPECT_EQ(ParseError("max_batch_size: 4\nbatch_delay_us: 20000000\n"),
            "models/mlp/config.yaml:2: batch_delay_us: must be at most 10000000, got 20000000");
  EXPECT_EQ(ParseError("max_batch_size: 4\nbatch_delay_us: [1]\n"),
            "models/mlp/config.yaml:2: batch_delay_us: must be an integer >= 0, got a list");
}

TEST(ModelConfigTest, RefusesABatchDelayWithoutBatching) {
  EXPECT_EQ(ParseError("batch_delay_us: 100\n"),
            "models/mlp/config.yaml:1: batch_delay_us: only applies to a batching model; set "
            "max_batch_size >= 1 as well, or remove batch_delay_us");
}

TEST(ModelConfigTest, RefusesMalformedTensorDeclarations) {
  EXPECT_EQ(ParseError("inputs: {x: 1}\n"),
            "models/mlp/config.yaml:1: inputs: must be a list of maps with name, datatype and "
            "dims, e.g. [{name: x, datatype: FP32, dims: [16]}], got a map");
  EXPECT_EQ(ParseError("outputs: [y]\n"),
            "models/mlp/config.yaml:1: outputs[0]: must be a map with name, datatype and dims, "
            "got 'y'");
  EXPECT_EQ(ParseError("inputs:\n  - {datatype: FP32, dims: [1]}\n"),
            "models/mlp/config.yaml:2: inputs[0].name: required; expected the tensor's name, "
            "e.g. x");
  EXPECT_EQ(ParseError("inputs:\n  - {name: x, dims: [1]}\n"),
            "models/mlp/config.yaml:2: inputs[0].datatype: required; expected one of BOOL, "
            "UINT8, INT8, INT16, INT32, INT64, FP32, FP64");
  EXPECT_EQ(ParseError("inputs:\n  - {name: x, datatype: FP32}\n"),
            "models/mlp/config.yaml:2: inputs[0].dims: required; expected a list of integers "
            ">= 1, or -1 for any size, e.g. [-1, 16]");
  EXPECT_EQ(ParseError("inputs:\n  - {name: x, datatype: float32, dims: [1]}\n"),
            "models/mlp/config.yaml:2: inputs[0].datatype: must be one of BOOL, UINT8, INT8, "
            "INT16, INT32, INT64, FP32, FP64, got 'float32'");
  EXPECT_EQ(ParseError("inputs:\n  - {name: x, datatype: FP32, dims: [0]}\n"),
            "models/mlp/config.yaml:2: inputs[0].dims[0]: must be an integer >= 1 or -1, got 0");
  EXPECT_EQ(ParseError("inputs:\n  - {name: x, datatype: FP32, dims: 16}\n"),
            "models/mlp/config.yaml:2: inputs[0].dims: must be a list of integers >= 1, or -1 "
            "for any size, e.g. [-1, 16], got 16");
  EXPECT_EQ(ParseError("inputs:\n  - {name: x, datatype: FP32, dims: [1], shape: [1]}\n"),
            "models/mlp/config.yaml:2: inputs[0].shape: unknown key; accepted keys: name, "
            "datatype, dims");
  EXPECT_EQ(ParseError("inputs:\n"
                       "  - {name: x, datatype: FP32, dims: [1]}\n"
                       "  - {name: x, datatype: FP32, dims: [2]}\n"),
            "models/mlp/config.yaml:3: inputs[1].name: 'x' is declared twice, at lines 2 and 3; "
            "names must be unique");
}

TEST(ModelConfigTest, RefusesWarmupWithoutDeclaredInputs) {
  EXPECT_EQ(ParseError("warmup:\n  - inputs: {x: {dims: [1]}}\n"),
            "models/mlp/config.yaml:1: warmup: needs the model's inputs declared (the 'inputs' "
            "key), which give each warmup input its datatype");
}

TEST(ModelConfigTest, RefusesMalformedWarmupEntries) {
  const std::string head =
      "max_batch_size: 4\n"
      "inputs: [{name: x, datatype: FP32, dims: [16]}]\n";  // lines 1-2
  EXPECT_EQ(ParseError(head + "warmup: {x: 1}\n"),
            "models/mlp/config.yaml:3: warmup: must be a list of maps such as {count: 2, inputs: "
            "{x: {dims: [1, 16], fill: random}}}, got a map");
  EXPECT_EQ(ParseError(head + "warmup:\n  - count: 2\n"),
            "models/mlp/config.yaml:4: warmup[0].inputs: required; expected a map from each "
            "declared input to {dims: [...], fill: zero|one|random}");
  EXPECT_EQ(ParseError(head + "warmup:\n  - {count: 0, inputs: {x: {dims: [1, 16]}}}\n"),
            "models/mlp/config.yaml:4: warmup[0].count: must be an integer >= 1, got 0");
  EXPECT_EQ(ParseError(head + "warmup:\n  - inputs: {x: {dims: [1, 16]}, y: {dims: [1]}}\n"),
            "models/mlp/config.yaml:4: warmup[0].inputs.y: not a declared input; the inputs are: "
            "x");
  EXPECT_EQ(ParseError(head + "warmup:\n  - inputs: {}\n"),
            "models/mlp/config.yaml:4: warmup[0].inputs.x: required; a warmup request gives "
            "every declared input");
  EXPECT_EQ(ParseError(head + "warmup:\n  - inputs: {x: {dims: [1, 16], fill: ones}}\n"),
            "models/mlp/config.yaml:4: warmup[0].inputs.x.fill: must be one of zero, one, "
            "random, got 'ones'");
  EXPECT_EQ(ParseError(head + "warmup:\n  - inputs: {x: {fill: one}}\n"),
            "models/mlp/config.yaml:4: warmup[0].inputs.x.dims: required; expected the full "
            "shape the model receives, e.g. [1, 16]");
  EXPECT_EQ(ParseError(head + "warmup:\n  - inputs: {x: {dims: [-1, 16]}}\n"),
            "models/mlp/config.yaml:4: warmup[0].inputs.x.dims[0]: must be an integer >= 1, "
            "got -1");
}

TEST(ModelConfigTest, RefusesWarmupShapesNoRequestCouldHave) {
  const std::string head =
      "max_batch_size: 4\n"
      "inputs: [{name: x, datatype: FP32, dims: [16]}]\n"
      "warmup:\n";
  EXPECT_EQ(ParseError(head + "  - inputs: {x: {dims: [16]}}\n"),
            "models/mlp/config.yaml:4: warmup[0].inputs.x.dims: must match the input's shape "
            "[-1,16] (batch dimension first), got [16]");
  EXPECT_EQ(ParseError(head + "  - inputs: {x: {dims: [2, 15]}}\n"),
            "models/mlp/config.yaml:4: warmup[0].inputs.x.dims: must match the input's shape "
            "[-1,16] (batch dimension first), got [2,15]");
  EXPECT_EQ(ParseError(head + "  - inputs: {x: {dims: [5, 16]}}\n"),
            "models/mlp/config.yaml:4: warmup[0].inputs.x.dims: the batch dimension must be at "
            "most max_batch_size (4), got 5");
  EXPECT_EQ(ParseError("inputs: [{name: x, datatype: FP32, dims: [-1]}]\n"
                       "warmup:\n  - inputs: {x: {dims: [100000, 100000]}}\n"),
            "models/mlp/config.yaml:3: warmup[0].inputs.x.dims: must match the input's shape "
            "[-1], got [100000,100000]");
  EXPECT_EQ(ParseError("inputs: [{name: x, datatype: FP32, dims: [-1, -1]}]\n"
                       "warmup:\n  - inputs: {x: {dims: [100000, 100000]}}\n"),
            "models/mlp/config.yaml:3: warmup[0].inputs.x.dims: must hold at most 134217728 "
            "elements, got [100000,100000]");
}

TEST(ModelConfigTest, ReportsEveryProblemInFileOrder) {
  EXPECT_EQ(ParseError("threads_per_instance: 0\ninstances: 0\nfoo: 1\n"),
            "models/mlp/config.yaml:1: threads_per_instance: must be an integer >= 1, got 0\n"
            "models/mlp/config.yaml:2: instances: must be an integer >= 1, got 0\n"
            "models/mlp/config.yaml:3: foo: unknown key; accepted keys: inputs, outputs, "
            "max_batch_size, batch_delay_us, instances, threads_per_instance, warmup, version_policy, ensemble, rollout");
}

TEST(ModelConfigTest, ARolloutCanaryTakesItsKeysAndDefaultsTheRest) {
  ModelConfig none = ParseOk("instances: 1\n");
  EXPECT_FALSE(none.rollout.canary.has_value());
  ModelConfig config = ParseOk(
      "rollout:\n"
      "  canary: {share: 0.05, duration_s: 30, min_requests: 200, max_error_rate: 0.01,\n"
      "           max_p99_ratio: 1.5, max_output_drift: 0.05, mirror: true}\n");
  ASSERT_TRUE(config.rollout.canary.has_value());
  const CanaryConfig& c = *config.rollout.canary;
  EXPECT_DOUBLE_EQ(c.share, 0.05);
  EXPECT_DOUBLE_EQ(c.duration_s, 30);
  EXPECT_EQ(c.min_requests, 200);
  EXPECT_DOUBLE_EQ(c.max_error_rate, 0.01);
  EXPECT_DOUBLE_EQ(c.max_p99_ratio, 1.5);
  ASSERT_TRUE(c.max_output_drift.has_value());
  EXPECT_DOUBLE_EQ(*c.max_output_drift, 0.05);
  EXPECT_TRUE(c.mirror);
  ModelConfig defaults = ParseOk("rollout: {canary: {}}\n");
  ASSERT_TRUE(defaults.rollout.canary.has_value());
  EXPECT_DOUBLE_EQ(defaults.rollout.canary->share, 0.1);
  EXPECT_FALSE(defaults.rollout.canary->max_output_drift.has_value());
  EXPECT_FALSE(defaults.rollout.canary->mirror);
}

TEST(ModelConfigTest, RefusesABadRolloutNamingTheKey) {
  EXPECT_EQ(ParseError("rollout:\n  canary:\n    shares: 0.1\n"),
            "models/mlp/config.yaml:3: rollout.canary.shares: unknown key; accepted keys: share, "
            "duration_s, min_requests, max_error_rate, max_p99_ratio, max_output_drift, mirror");
  EXPECT_EQ(ParseError("rollout:\n  canary:\n    share: 0\n"),
            "models/mlp/config.yaml:3: rollout.canary.share: must be a number > 0 and <= 1, got 0");
  EXPECT_EQ(ParseError("rollout: {canary: {share: lots}}\n"),
            "models/mlp/config.yaml:1: rollout.canary.share: must be a number > 0 and <= 1, got "
            "'lots'");
  EXPECT_EQ(ParseError("rollout: {canary: {min_requests: 0}}\n"),
            "models/mlp/config.yaml:1: rollout.canary.min_requests: must be an integer >= 1, got 0");
  EXPECT_EQ(ParseError("rollout: {canary: {max_p99_ratio: 0.5}}\n"),
            "models/mlp/config.yaml:1: rollout.canary.max_p99_ratio: must be >= 1 (the canary's "
            "p99 over the current version's), or 0 to leave latency out, got '0.5'");
  EXPECT_EQ(ParseError("rollout: {canary: {mirror: yes please}}\n"),
            "models/mlp/config.yaml:1: rollout.canary.mirror: must be true or false, got 'yes "
            "please'");
  EXPECT_EQ(ParseError("rollout: {blue_green: {}}\n"),
            "models/mlp/config.yaml:1: rollout.blue_green: unknown key; accepted keys: canary");
  EXPECT_THAT(ParseError("version_policy: all\nrollout: {canary: {}}\n"),
              HasSubstr("config.yaml:2: rollout: a canary needs version_policy latest"));
  EXPECT_THAT(ParseError("ensemble: {models: [a, b], combine: mean}\nrollout: {canary: {}}\n"),
              HasSubstr("config.yaml:2: rollout: not allowed in an ensemble's config"));
}

TEST(ModelConfigTest, ReadingAMissingFileNamesIt) {
  absl::StatusOr<ModelConfig> config = ReadModelConfigFile("/nonexistent/m/config.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().message(), "/nonexistent/m/config.yaml: cannot read the model config");
}

TEST(ModelConfigTest, VersionPolicyDefaultsToLatestAndAcceptsAll) {
  EXPECT_EQ(ParseOk("").version_policy, VersionPolicy::kLatest);
  EXPECT_EQ(ParseOk("version_policy: latest\n").version_policy, VersionPolicy::kLatest);
  EXPECT_EQ(ParseOk("version_policy: all\n").version_policy, VersionPolicy::kAll);
}

TEST(ModelConfigTest, RefusesAnUnknownVersionPolicyNamingTheChoices) {
  EXPECT_EQ(ParseError("instances: 1\nversion_policy: newest\n"),
            "models/mlp/config.yaml:2: version_policy: must be latest or all, got 'newest'");
  EXPECT_EQ(ParseError("version_policy: [latest]\n"),
            "models/mlp/config.yaml:1: version_policy: must be latest or all, got a list");
}

TEST(ModelConfigTest, ParsesAnEnsemble) {
  ModelConfig config = ParseOk("ensemble: {models: [a, b, c], combine: geometric_mean}\n");
  ASSERT_TRUE(config.ensemble.has_value());
  EXPECT_EQ(config.ensemble->models, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(config.ensemble->combine, Combiner::kGeometricMean);
  EXPECT_FALSE(ParseOk("instances: 2\n").ensemble.has_value());
}

TEST(ModelConfigTest, RefusesMalformedEnsemblesSayingWhatIsWrong) {
  EXPECT_EQ(ParseError("ensemble: [a, b]\n"),
            "models/mlp/config.yaml:1: ensemble: must be a map such as {models: [a, b], "
            "combine: mean}, got a list");
  EXPECT_EQ(ParseError("ensemble: {combine: mean}\n"),
            "models/mlp/config.yaml:1: ensemble: needs 'models', the list of member models");
  EXPECT_EQ(ParseError("ensemble: {models: [a, b]}\n"),
            "models/mlp/config.yaml:1: ensemble: needs 'combine', one of mean, geometric_mean, "
            "harmonic_mean, median, vote");
  EXPECT_EQ(ParseError("ensemble: {models: [a], combine: mean}\n"),
            "models/mlp/config.yaml:1: ensemble.models: must be a list of at least 2 model "
            "names, got 1 name(s)");
  EXPECT_EQ(ParseError("ensemble:\n  models: [a, a]\n  combine: mean\n"),
            "models/mlp/config.yaml:2: ensemble.models[1]: 'a' is listed twice");
  EXPECT_EQ(ParseError("ensemble:\n  models: [a, [b]]\n  combine: mean\n"),
            "models/mlp/config.yaml:2: ensemble.models[1]: must be a model name, got a list");
  EXPECT_EQ(ParseError("ensemble:\n  models: [a, b]\n  combine: average\n"),
            "models/mlp/config.yaml:3: ensemble.combine: must be one of mean, geometric_mean, "
            "harmonic_mean, median, vote, got 'average'");
  EXPECT_THAT(ParseError("ensemble:\n  models: [a, b]\n  combine: mean\n  weights: [1, 2]\n"),
              HasSubstr("config.yaml:4: ensemble.weights: unknown key; accepted keys: models, "
                        "combine"));
  EXPECT_EQ(ParseError("max_batch_size: 4\nensemble: {models: [a, b], combine: vote}\n"),
            "models/mlp/config.yaml:1: max_batch_size: not allowed in an ensemble's config: its "
            "inputs, outputs and batching are its members'; keep only 'ensemble'");
}

}  // namespace
}  // namespace shoal::serve
