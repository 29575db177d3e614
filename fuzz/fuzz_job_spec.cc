// The job file parser (src/spec/spec_parser.h) on any text: it must answer a JobSpec or an
// InvalidArgument, never crash, hang or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <string>

#include "backends/slurm/slurm_section.h"
#include "backends/spark/spark_section.h"
#include "backends/yarn/yarn_section.h"
#include "spec/spec_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  // An absolute base: relative working_dir values resolve without reading the current
  // directory, so an input's result does not depend on where the fuzzer runs.
  // With the backends' sections, as `shoal` reads a job file (cli/backends_registry.cc).
  static const shoal::spec::JobSections kSections = {shoal::backends::SlurmJobSection(),
                                                     shoal::backends::YarnJobSection(),
                                                     shoal::backends::SparkJobSection()};
  absl::StatusOr<shoal::spec::JobSpec> spec =
      shoal::spec::ParseJobSpec(text, "job.yaml", "/fuzz/jobs", kSections);
  if (!spec.ok() && spec.status().code() != absl::StatusCode::kInvalidArgument) {
    __builtin_trap();  // the contract: every problem with the text is an InvalidArgument
  }
  return 0;
}
