#include "serve/repository/served_version.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <random>
#include <set>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "serve/runtime/model_backend.h"
#include "serve/scheduling/model_scheduler.h"

namespace shoal::serve {
namespace {

std::string Names(const std::vector<TensorSignature>& tensors) {
  std::vector<std::string> names;
  for (const auto& t : tensors) names.push_back(t.name);
  return absl::StrJoin(names, ", ");
}

// The outputs named in `requested`, in that order, or which one the model did not return.
absl::StatusOr<std::vector<Tensor>> SelectOutputs(const std::string& model_name,
                                                  std::vector<Tensor> outputs,
                                                  const std::vector<std::string>& requested) {
  std::vector<Tensor> selected;
  for (const std::string& name : requested) {
    auto it = std::find_if(outputs.begin(), outputs.end(),
                           [&](const Tensor& t) { return t.name == name; });
    if (it == outputs.end()) {
      std::vector<std::string> names;
      for (const Tensor& t : outputs) names.push_back(t.name);
      return absl::InvalidArgumentError(absl::StrCat("model '", model_name, "' has no output '",
                                                     name, "'; its outputs are: ",
                                                     absl::StrJoin(names, ", ")));
    }
    selected.push_back(std::move(*it));
  }
  return selected;
}

// Whether `shape` fits `pattern` (-1 matches any size).
bool ShapeMatches(const std::vector<int64_t>& shape, const std::vector<int64_t>& pattern) {
  if (shape.size() != pattern.size()) return false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (pattern[i] != -1 && pattern[i] != shape[i]) return false;
  }
  return true;
}

// The full shape of a declared tensor: the batch dimension first when the model batches.
std::vector<int64_t> FullShape(const TensorConfig& tensor, int64_t max_batch_size) {
  std::vector<int64_t> shape;
  if (max_batch_size > 0) shape.push_back(-1);
  shape.insert(shape.end(), tensor.dims.begin(), tensor.dims.end());
  return shape;
}

// A model instance: one BackendModel driven on its own thread. Names the module's outputs
// (config order, Dict keys, or output__<i>) and checks them against the config.
class BackendRunner final : public ModelRunner {
 public:
  BackendRunner(ModelBackend* backend, std::unique_ptr<BackendModel> model, int threads,
                const std::vector<TensorSignature>* declared_outputs, std::string label)
      : backend_(backend),
        model_(std::move(model)),
        threads_(threads),
        declared_outputs_(declared_outputs),
        label_(std::move(label)) {}

  void PrepareThread() override { backend_->PrepareThread(threads_); }

  absl::StatusOr<std::vector<Tensor>> Run(std::vector<Tensor> inputs) override {
    std::vector<Tensor> raw;
    std::string error;
    if (!model_->Run(inputs, &raw, &error)) {
      return absl::InternalError(absl::StrCat(label_, " failed: ", error));
    }
    return NameOutputs(std::move(raw));
  }

 private:
  absl::StatusOr<std::vector<Tensor>> NameOutputs(std::vector<Tensor> raw) const {
    bool named = !raw.empty() && !raw.front().name.empty();
    if (declared_outputs_->empty()) {
      if (!named) {
        for (size_t i = 0; i < raw.size(); ++i) raw[i].name = absl::StrCat("output__", i);
      }
      return raw;
    }
    std::vector<Tensor> outputs;
    if (named) {
      for (const TensorSignature& declared : *declared_outputs_) {
        auto it = std::find_if(raw.begin(), raw.end(),
                               [&](const Tensor& t) { return t.name == declared.name; });
        if (it == raw.end()) {
          return absl::InternalError(absl::StrCat(label_, ": the model's returned dict has no '",
                                                  declared.name, "', a declared output"));
        }
        outputs.push_back(std::move(*it));
      }
    } else {
      if (raw.size() != declared_outputs_->size()) {
        return absl::InternalError(absl::StrCat(
            label_, ": the model returned ", raw.size(), " tensor(s), its config declares ",
            declared_outputs_->size(), " output(s) (", Names(*declared_outputs_), ")"));
      }
      for (size_t i = 0; i < raw.size(); ++i) {
        raw[i].name = (*declared_outputs_)[i].name;
        outputs.push_back(std::move(raw[i]));
      }
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      const TensorSignature& declared = (*declared_outputs_)[i];
      if (outputs[i].datatype != *declared.datatype) {
        return absl::InternalError(absl::StrCat(
            label_, ": output '", declared.name, "' is ", DataTypeName(outputs[i].datatype),
            ", its config declares ", DataTypeName(*declared.datatype)));
      }
      if (!ShapeMatches(outputs[i].shape, *declared.shape)) {
        return absl::InternalError(absl::StrCat(
            label_, ": output '", declared.name, "' has shape ", ShapeString(outputs[i].shape),
            ", its config declares ", ShapeString(*declared.shape)));
      }
    }
    return outputs;
  }

  ModelBackend* const backend_;
  const std::unique_ptr<BackendModel> model_;
  const int threads_;
  const std::vector<TensorSignature>* const declared_outputs_;  // owned by the version
  const std::string label_;
};

template <typename T>
void FillWith(std::vector<std::byte>& data, size_t count, const std::function<T()>& next) {
  data.resize(count * sizeof(T));
  for (size_t i = 0; i < count; ++i) {
    T value = next();
    std::memcpy(data.data() + i * sizeof(T), &value, sizeof(T));
  }
}

template <typename T>
void Fill(std::vector<std::byte>& data, size_t count, WarmupFill fill, std::mt19937& rng) {
  if (fill == WarmupFill::kZero) {
    data.assign(count * sizeof(T), std::byte{0});
    return;
  }
  if (fill == WarmupFill::kOne) {
    FillWith<T>(data, count, [] { return T(1); });
    return;
  }
  if constexpr (std::is_floating_point_v<T>) {
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    FillWith<T>(data, count, [&] { return static_cast<T>(uniform(rng)); });
  } else {
    // Small non-negative integers: valid indices for an embedding, valid bools.
    std::uniform_int_distribution<int> uniform(0, std::is_same_v<T, bool> ? 1 : 9);
    FillWith<T>(data, count, [&] { return static_cast<T>(uniform(rng)); });
  }
}

Tensor WarmupTensor(const WarmupInput& input, DataType datatype, std::mt19937& rng) {
  Tensor tensor;
  tensor.name = input.name;
  tensor.datatype = datatype;
  tensor.shape = input.shape;
  size_t count = static_cast<size_t>(*ElementCount(input.shape));  // bounded by the parser
  switch (datatype) {
    case DataType::kBool: Fill<bool>(tensor.data, count, input.fill, rng); break;
    case DataType::kUint8: Fill<uint8_t>(tensor.data, count, input.fill, rng); break;
    case DataType::kInt8: Fill<int8_t>(tensor.data, count, input.fill, rng); break;
    case DataType::kInt16: Fill<int16_t>(tensor.data, count, input.fill, rng); break;
    case DataType::kInt32: Fill<int32_t>(tensor.data, count, input.fill, rng); break;
    case DataType::kInt64: Fill<int64_t>(tensor.data, count, input.fill, rng); break;
    case DataType::kFp32: Fill<float>(tensor.data, count, input.fill, rng); break;
    case DataType::kFp64: Fill<double>(tensor.data, count, input.fill, rng); break;
  }
  return tensor;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServedVersion>> ServedVersion::Load(
    const VersionLoadOptions& options, ModelBackend* backend, const Clock* clock) {
  std::unique_ptr<ServedVersion> version(new ServedVersion());
  version->model_name_ = options.model_name;
  version->version_ = options.version;
  version->config_ = options.config;
  version->threads_per_instance_ = options.threads_per_instance;
  version->clock_ = clock;
  const ModelConfig& config = version->config_;
  // Runtime errors go to clients: they name the model, not the server's files.
  std::string label = absl::StrCat("model '", options.model_name, "' version ", options.version);

  std::vector<std::unique_ptr<BackendModel>> models;
  for (int i = 0; i < config.instances; ++i) {
    std::string error;
    std::unique_ptr<BackendModel> model = backend->Load(options.model_path, &error);
    if (!model) return absl::InvalidArgumentError(error);
    models.push_back(std::move(model));
  }
  const std::vector<std::string>& arguments = models.front()->ArgumentNames();

  // Inputs: the config's, matched to forward's arguments by name when the names are the same
  // set, else by position; without a config, forward's arguments themselves.
  if (config.inputs.empty()) {
    for (const std::string& name : arguments) {
      version->inputs_.push_back({name, std::nullopt, std::nullopt});
    }
    version->argument_order_ = arguments;
  } else {
    if (config.inputs.size() != arguments.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          options.model_path, ": its config declares ", config.inputs.size(),
          " input(s), forward takes ",
          arguments.size(), " (", absl::StrJoin(arguments, ", "), ")"));
    }
    std::set<std::string> declared_names, argument_names(arguments.begin(), arguments.end());
    for (const TensorConfig& input : config.inputs) {
      declared_names.insert(input.name);
      version->inputs_.push_back(
          {input.name, input.datatype, FullShape(input, config.max_batch_size)});
    }
    if (declared_names == argument_names) {
      version->argument_order_ = arguments;
    } else {
      for (const TensorConfig& input : config.inputs) version->argument_order_.push_back(input.name);
    }
  }
  for (const TensorConfig& output : config.outputs) {
    version->outputs_.push_back(
        {output.name, output.datatype, FullShape(output, config.max_batch_size)});
  }

  SchedulerOptions scheduler_options;
  scheduler_options.policy.max_batch_size = config.max_batch_size;
  scheduler_options.policy.max_delay = std::chrono::microseconds(config.batch_delay_us);
  scheduler_options.slots = options.compute_slots;
  scheduler_options.threads_per_instance = options.threads_per_instance;
  std::mt19937 rng(12345);
  for (const WarmupSample& sample : config.warmup) {
    std::vector<Tensor> request;
    for (const std::string& name : version->argument_order_) {
      auto input = std::find_if(sample.inputs.begin(), sample.inputs.end(),
                                [&](const WarmupInput& w) { return w.name == name; });
      auto declared = std::find_if(config.inputs.begin(), config.inputs.end(),
                                   [&](const TensorConfig& t) { return t.name == name; });
      request.push_back(WarmupTensor(*input, declared->datatype, rng));
    }
    for (int i = 0; i < sample.count; ++i) scheduler_options.warmup.push_back(request);
  }

  std::vector<std::unique_ptr<ModelRunner>> runners;
  for (auto& model : models) {
    runners.push_back(std::make_unique<BackendRunner>(
        backend, std::move(model), options.threads_per_instance, &version->outputs_, label));
  }
  auto scheduler = ModelScheduler::Start(std::move(scheduler_options), std::move(runners), clock,
                                         &version->stats_);
  if (!scheduler.ok()) return scheduler.status();
  version->scheduler_ = *std::move(scheduler);
  return version;
}

ServedVersion::~ServedVersion() = default;

namespace {

bool SameSignature(const TensorSignature& a, const TensorSignature& b) {
  return a.name == b.name && a.datatype == b.datatype && a.shape == b.shape;
}

std::string Describe(const std::vector<TensorSignature>& tensors) {
  std::vector<std::string> parts;
  for (const TensorSignature& t : tensors) {
    parts.push_back(absl::StrCat(t.name, " ", t.datatype ? DataTypeName(*t.datatype) : "any", " ",
                                 t.shape ? ShapeString(*t.shape) : "any"));
  }
  return parts.empty() ? "none" : absl::StrJoin(parts, ", ");
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServedVersion>> ServedVersion::CreateEnsemble(
    const EnsembleOptions& options, const Clock* clock) {
  const std::vector<std::shared_ptr<ServedVersion>>& members = options.members;
  if (members.size() < 2 || members.size() != options.config.models.size()) {
    return absl::InvalidArgumentError("an ensemble needs at least 2 members");
  }
  const ServedVersion& first = *members.front();
  const std::string& first_name = options.config.models.front();
  for (size_t i = 0; i < members.size(); ++i) {
    const std::string& name = options.config.models[i];
    if (members[i]->outputs().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "member '", name, "' declares no outputs; an ensemble's members must declare them in "
          "their config.yaml, so that they can be checked to combine"));
    }
    if (i == 0) continue;
    const auto& inputs = members[i]->inputs();
    if (inputs.size() != first.inputs().size() ||
        !std::equal(inputs.begin(), inputs.end(), first.inputs().begin(), SameSignature)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "members '", first_name, "' and '", name, "' take different inputs (",
          Describe(first.inputs()), " vs ", Describe(inputs), "); every member gets the same"));
    }
    const auto& outputs = members[i]->outputs();
    if (outputs.size() != first.outputs().size() ||
        !std::equal(outputs.begin(), outputs.end(), first.outputs().begin(), SameSignature)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "members '", first_name, "' and '", name, "' have incompatible outputs (",
          Describe(first.outputs()), " vs ", Describe(outputs), "); ",
          CombinerName(options.config.combine), " needs the same outputs from every member"));
    }
  }
  std::unique_ptr<ServedVersion> version(new ServedVersion());
  version->model_name_ = options.model_name;
  version->version_ = 1;
  version->clock_ = clock;
  version->ensemble_ = options.config;
  version->lookup_ = options.lookup;
  version->inputs_ = first.inputs();
  for (const TensorSignature& output : first.outputs()) {
    if (!CombinerAccepts(options.config.combine, *output.datatype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "output '", output.name, "' of the members is ", DataTypeName(*output.datatype),
          ", which ",
          CombinerName(options.config.combine), " does not combine (",
          options.config.combine == Combiner::kVote ? "any numeric datatype but BOOL"
                                                    : "FP32 or FP64 only",
          ")"));
    }
    TensorSignature combined = output;
    combined.datatype = CombinedDataType(options.config.combine, *output.datatype);
    combined.shape = CombinedShape(options.config.combine, *output.shape);
    version->outputs_.push_back(std::move(combined));
  }
  return version;
}

absl::StatusOr<std::vector<Tensor>> ServedVersion::InferEnsemble(InferRequest request) {
  for (const std::string& name : request.requested_outputs) {
    bool known = std::any_of(outputs_.begin(), outputs_.end(),
                             [&](const TensorSignature& s) { return s.name == name; });
    if (!known) {
      stats_.invalid_count += 1;
      return absl::InvalidArgumentError(absl::StrCat("model '", model_name_,
                                                     "' has no output '", name,
                                                     "'; its outputs are: ", Names(outputs_)));
    }
  }
  Clock::TimePoint start = clock_->Now();
  auto elapsed = [&] {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(clock_->Now() - start).count());
  };
  auto fail = [&](absl::Status status) {
    uint64_t ns = elapsed();
    stats_.RecordLatency(ns);
    stats_.failure_count += 1;
    stats_.failure_ns += ns;
    return status;
  };
  std::vector<std::vector<Tensor>> results;
  for (size_t i = 0; i < ensemble_.models.size(); ++i) {
    const std::string& name = ensemble_.models[i];
    absl::StatusOr<std::shared_ptr<ServedVersion>> member = lookup_(name);
    if (!member.ok()) {
      return fail(absl::UnavailableError(absl::StrCat("ensemble '", model_name_, "': member '",
                                                      name, "' is not available: ",
                                                      member.status().message())));
    }
    InferRequest sub;
    // The last member takes the decoded tensors themselves; the others get copies.
    sub.inputs = i + 1 == ensemble_.models.size() ? std::move(request.inputs) : request.inputs;
    absl::StatusOr<std::vector<Tensor>> outputs = (*member)->Infer(std::move(sub));
    if (!outputs.ok()) {
      if (outputs.status().code() == absl::StatusCode::kInvalidArgument) {
        stats_.invalid_count += 1;  // the request, checked by the member's signature
        return absl::InvalidArgumentError(absl::StrCat("ensemble '", model_name_, "': ",
                                                       outputs.status().message()));
      }
      return fail(absl::Status(outputs.status().code(),
                               absl::StrCat("ensemble '", model_name_, "': ",
                                            outputs.status().message())));
    }
    results.push_back(*std::move(outputs));
  }
  std::vector<Tensor> combined;
  for (const TensorSignature& output : outputs_) {
    if (!request.requested_outputs.empty() &&
        !std::count(request.requested_outputs.begin(), request.requested_outputs.end(),
                    output.name)) {
      continue;
    }
    std::vector<const Tensor*> parts;
    for (size_t m = 0; m < results.size(); ++m) {
      auto it = std::find_if(results[m].begin(), results[m].end(),
                             [&](const Tensor& t) { return t.name == output.name; });
      if (it == results[m].end()) {
        return fail(absl::InternalError(absl::StrCat("ensemble '", model_name_, "': member '",
                                                     ensemble_.models[m], "' returned no '",
                                                     output.name, "'")));
      }
      parts.push_back(&*it);
    }
    absl::StatusOr<Tensor> tensor = CombineOutputs(ensemble_.combine, parts);
    if (!tensor.ok()) {
      return fail(absl::InternalError(
          absl::StrCat("ensemble '", model_name_, "': ", tensor.status().message())));
    }
    combined.push_back(*std::move(tensor));
  }
  if (!request.requested_outputs.empty()) {
    std::vector<Tensor> ordered;
    for (const std::string& name : request.requested_outputs) {
      auto it = std::find_if(combined.begin(), combined.end(),
                             [&](const Tensor& t) { return t.name == name; });
      ordered.push_back(std::move(*it));
    }
    combined = std::move(ordered);
  }
  uint64_t ns = elapsed();
  stats_.RecordLatency(ns);
  stats_.success_count += 1;
  stats_.success_ns += ns;
  stats_.inference_count += 1;
  stats_.execution_count += 1;
  return combined;
}

absl::StatusOr<std::vector<Tensor>> ServedVersion::ValidateInputs(std::vector<Tensor> inputs,
                                                                  int64_t* rows) const {
  for (const Tensor& input : inputs) {
    bool known = std::any_of(inputs_.begin(), inputs_.end(),
                             [&](const TensorSignature& s) { return s.name == input.name; });
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat("model '", model_name_,
                                                     "' has no input '", input.name,
                                                     "'; its inputs are: ", Names(inputs_)));
    }
  }
  std::optional<int64_t> batch;
  for (const TensorSignature& s : inputs_) {
    auto input = std::find_if(inputs.begin(), inputs.end(),
                              [&](const Tensor& t) { return t.name == s.name; });
    if (input == inputs.end()) {
      return absl::InvalidArgumentError(absl::StrCat("missing input '", s.name, "'; model '",
                                                     model_name_,
                                                     "' takes: ", Names(inputs_)));
    }
    if (s.datatype && input->datatype != *s.datatype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input '", s.name, "': datatype ", DataTypeName(input->datatype), ", model '",
          model_name_, "' expects ", DataTypeName(*s.datatype)));
    }
    if (s.shape && !ShapeMatches(input->shape, *s.shape)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input '", s.name, "': shape ", ShapeString(input->shape), " does not match ",
          ShapeString(*s.shape), config_.max_batch_size > 0 ? " (batch dimension first)" : "",
          " (-1: any size)"));
    }
    if (config_.max_batch_size > 0) {
      if (input->shape.empty() || input->shape[0] < 1 ||
          input->shape[0] > config_.max_batch_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "input '", s.name, "': batch size (dimension 0) must be 1 to ",
            config_.max_batch_size, " (max_batch_size), got ", ShapeString(input->shape)));
      }
      if (batch && *batch != input->shape[0]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "input '", s.name, "': batch size ", input->shape[0], " differs from the other "
            "inputs' ", *batch, "; every input of a request has the same dimension 0"));
      }
      batch = input->shape[0];
    }
  }
  *rows = batch.value_or(1);
  // Each input is known, each argument given and no name twice: the same names in the same
  // order (a single input, say) are already the model's order.
  if (std::equal(inputs.begin(), inputs.end(), argument_order_.begin(), argument_order_.end(),
                 [](const Tensor& t, const std::string& name) { return t.name == name; })) {
    return inputs;
  }
  std::vector<Tensor> ordered;
  ordered.reserve(argument_order_.size());
  for (const std::string& name : argument_order_) {
    auto input = std::find_if(inputs.begin(), inputs.end(),
                              [&](const Tensor& t) { return t.name == name; });
    ordered.push_back(std::move(*input));
  }
  return ordered;
}

absl::StatusOr<std::vector<Tensor>> ServedVersion::Infer(InferRequest request) {
  if (!ensemble_.models.empty()) {
    stats_.in_flight += 1;
    absl::StatusOr<std::vector<Tensor>> outputs = InferEnsemble(std::move(request));
    stats_.in_flight -= 1;
    return outputs;
  }
  auto promise = std::make_shared<std::promise<absl::StatusOr<std::vector<Tensor>>>>();
  std::future<absl::StatusOr<std::vector<Tensor>>> future = promise->get_future();
  {
    // This thread waits below, so it cannot be where the request completes.
    CompletionHome::Suspend on_instance_thread;
    InferAsync(std::move(request), [promise](absl::StatusOr<std::vector<Tensor>> result) {
      promise->set_value(std::move(result));
    });
  }
  return future.get();
}

void ServedVersion::InferAsync(InferRequest request, InferenceDone done) {
  if (!ensemble_.models.empty()) {
    done(Infer(std::move(request)));
    return;
  }
  stats_.in_flight += 1;
  int64_t rows = 1;
  auto inputs = ValidateInputs(std::move(request.inputs), &rows);
  if (!inputs.ok()) {
    stats_.invalid_count += 1;
    stats_.in_flight -= 1;
    done(inputs.status());
    return;
  }
  if (!outputs_.empty()) {
    for (const std::string& name : request.requested_outputs) {
      bool known = std::any_of(outputs_.begin(), outputs_.end(),
                               [&](const TensorSignature& s) { return s.name == name; });
      if (!known) {
        stats_.invalid_count += 1;
        stats_.in_flight -= 1;
        done(absl::InvalidArgumentError(absl::StrCat("model '", model_name_, "' has no output '",
                                                     name, "'; its outputs are: ",
                                                     Names(outputs_))));
        return;
      }
    }
  }
  Clock::TimePoint start = clock_->Now();
  // Runs on the instance thread. The version outlives it: the caller holds the version until
  // `done` has run, and the scheduler, which the version owns, runs every request it took.
  scheduler_->Submit(
      *std::move(inputs), rows,
      [this, start, requested = std::move(request.requested_outputs),
       done = std::move(done)](absl::StatusOr<std::vector<Tensor>> outputs) mutable {
        uint64_t elapsed = static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(clock_->Now() - start).count());
        stats_.RecordLatency(elapsed);
        if (outputs.ok()) {
          stats_.success_count += 1;
          stats_.success_ns += elapsed;
        } else {
          stats_.failure_count += 1;
          stats_.failure_ns += elapsed;
        }
        stats_.in_flight -= 1;
        // `done` may release the caller's hold on this version: nothing below touches `this`.
        InferenceDone finish = std::move(done);
        if (!outputs.ok() || requested.empty()) return finish(std::move(outputs));
        finish(SelectOutputs(model_name_, *std::move(outputs), requested));
      });
}

}  // namespace shoal::serve
