// serve_libtorch_loop: the bare libtorch anchor of bench/serving_bench.py. Loads a TorchScript
// model.pt and calls its forward in a loop, with no server around it: what a server running the
// same model at the same batch sizes cannot beat.
//
//   serve_libtorch_loop --model DIR/lstm/1/model.pt --input tokens:INT64:32
//                       [--batch-sizes 1,4,16] [--duration S] [--warmup N]
//
// --input NAME:DATATYPE:DIM[xDIM...] (repeatable, in forward's order) gives each input's shape
// without the batch dimension; every call gets a fresh batch-first tensor of that shape (zeros
// for integer inputs, so that they are valid embedding indices; uniform [0, 1) for floats),
// made once per batch size. Runs in c10::InferenceMode on 1 intra-op thread (and 1 inter-op
// thread), as the servers of the benchmark do.
//
// Prints one JSON object on stdout: per batch size, calls, inferences (calls x batch size),
// inferences_per_s, calls_per_s and the median call time in ms. Exit status 2 for bad arguments,
// 1 when the model cannot be loaded or fails.

#include <ATen/Parallel.h>
#include <torch/script.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct InputSpec {
  std::string name;
  c10::ScalarType dtype;
  std::vector<int64_t> dims;  // without the batch dimension
};

struct Options {
  std::string model;
  std::vector<InputSpec> inputs;
  std::vector<int64_t> batch_sizes = {1};
  double duration_s = 3;
  int warmup = 20;
};

[[noreturn]] void UsageError(const std::string& message) {
  std::cerr << "serve_libtorch_loop: " << message << "\n"
            << "usage: serve_libtorch_loop --model FILE --input NAME:DATATYPE:DIMxDIM... "
               "[--input ...] [--batch-sizes 1,4,16] [--duration S] [--warmup N]\n"
               "  DATATYPE: BOOL UINT8 INT8 INT16 INT32 INT64 FP32 FP64\n";
  std::exit(2);
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, sep)) parts.push_back(part);
  return parts;
}

int64_t ParsePositive(const std::string& text, const std::string& what) {
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < 1) UsageError(what + ": not an integer >= 1: '" + text + "'");
  return v;
}

c10::ScalarType ParseDatatype(const std::string& name) {
  if (name == "BOOL") return c10::kBool;
  if (name == "UINT8") return c10::kByte;
  if (name == "INT8") return c10::kChar;
  if (name == "INT16") return c10::kShort;
  if (name == "INT32") return c10::kInt;
  if (name == "INT64") return c10::kLong;
  if (name == "FP32") return c10::kFloat;
  if (name == "FP64") return c10::kDouble;
  UsageError("unknown datatype '" + name + "'");
}

Options ParseArgs(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (i + 1 >= argc) UsageError(arg + " needs a value");
    std::string value = argv[++i];
    if (arg == "--model") {
      options.model = value;
    } else if (arg == "--input") {
      std::vector<std::string> parts = Split(value, ':');
      if (parts.size() != 3 || parts[0].empty()) {
        UsageError("--input takes NAME:DATATYPE:DIMxDIM..., got '" + value + "'");
      }
      InputSpec spec{parts[0], ParseDatatype(parts[1]), {}};
      for (const std::string& d : Split(parts[2], 'x')) spec.dims.push_back(ParsePositive(d, "--input dims"));
      options.inputs.push_back(std::move(spec));
    } else if (arg == "--batch-sizes") {
      options.batch_sizes.clear();
      for (const std::string& b : Split(value, ',')) {
        options.batch_sizes.push_back(ParsePositive(b, "--batch-sizes"));
      }
      if (options.batch_sizes.empty()) UsageError("--batch-sizes is empty");
    } else if (arg == "--duration") {
      char* end = nullptr;
      options.duration_s = std::strtod(value.c_str(), &end);
      if (*end != '\0' || !(options.duration_s > 0)) UsageError("--duration needs seconds > 0");
    } else if (arg == "--warmup") {
      options.warmup = static_cast<int>(ParsePositive(value, "--warmup"));
    } else {
      UsageError("unknown argument '" + arg + "'");
    }
  }
  if (options.model.empty()) UsageError("--model is required");
  if (options.inputs.empty()) UsageError("at least one --input is required");
  return options;
}

std::vector<c10::IValue> MakeInputs(const Options& options, int64_t batch) {
  std::vector<c10::IValue> inputs;
  for (const InputSpec& spec : options.inputs) {
    std::vector<int64_t> shape = {batch};
    shape.insert(shape.end(), spec.dims.begin(), spec.dims.end());
    auto opts = torch::TensorOptions().dtype(spec.dtype);
    inputs.emplace_back(c10::isFloatingType(spec.dtype) ? torch::rand(shape, opts)
                                                        : torch::zeros(shape, opts));
  }
  return inputs;
}

}  // namespace

int main(int argc, char** argv) {
  Options options = ParseArgs(argc, argv);
  at::set_num_interop_threads(1);
  at::get_num_threads();  // initialises this thread's OpenMP state first (docs/serving.md)
  at::set_num_threads(1);
  c10::InferenceMode guard;

  torch::jit::Module module;
  try {
    module = torch::jit::load(options.model);
    module.eval();
  } catch (const std::exception& e) {
    std::cerr << "serve_libtorch_loop: cannot load " << options.model << ": " << e.what() << "\n";
    return 1;
  }

  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(3);
  out << "{\"model\": \"" << options.model << "\", \"intra_op_threads\": " << at::get_num_threads()
      << ", \"duration_s\": " << options.duration_s << ", \"batch_sizes\": {";
  bool first = true;
  for (int64_t batch : options.batch_sizes) {
    std::vector<c10::IValue> inputs = MakeInputs(options, batch);
    std::vector<double> call_ms;
    int64_t calls = 0;
    double elapsed_s = 0;
    try {
      for (int i = 0; i < options.warmup; ++i) module.forward(inputs);
      using Clock = std::chrono::steady_clock;
      const auto start = Clock::now();
      const auto end = start + std::chrono::duration<double>(options.duration_s);
      auto last = start;
      while (last < end) {
        module.forward(inputs);
        auto now = Clock::now();
        // The median call time from the first 2M calls (the identity model makes millions).
        if (call_ms.size() < 2'000'000) {
          call_ms.push_back(std::chrono::duration<double, std::milli>(now - last).count());
        }
        last = now;
        ++calls;
      }
      elapsed_s = std::chrono::duration<double>(last - start).count();
    } catch (const std::exception& e) {
      std::cerr << "serve_libtorch_loop: the model failed at batch size " << batch << ": "
                << e.what() << "\n";
      return 1;
    }
    std::sort(call_ms.begin(), call_ms.end());
    double median = call_ms.empty() ? 0 : call_ms[call_ms.size() / 2];
    out << (first ? "" : ", ") << "\"" << batch << "\": {\"calls\": " << calls
        << ", \"inferences\": " << calls * batch
        << ", \"inferences_per_s\": " << static_cast<double>(calls * batch) / elapsed_s
        << ", \"calls_per_s\": " << static_cast<double>(calls) / elapsed_s
        << ", \"median_call_ms\": " << median << "}";
    first = false;
    std::cerr << "serve_libtorch_loop: batch " << batch << ": "
              << static_cast<double>(calls * batch) / elapsed_s << " inferences/s\n";
  }
  out << "}}";
  std::cout << out.str() << std::endl;
  return 0;
}
