#include "spec/job_spec.h"

namespace shoal::spec {

const Role* JobSpec::FindRole(const std::string& role_name) const {
  for (const auto& r : roles) {
    if (r.name == role_name) return &r;
  }
  return nullptr;
}

uint32_t JobSpec::TotalTasks() const {
  uint32_t n = 0;
  for (const auto& r : roles) n += r.instances;
  return n;
}

const char* FrameworkName(Framework f) {
  switch (f) {
    case Framework::kNone:
      return "none";
    case Framework::kPyTorch:
      return "pytorch";
    case Framework::kTensorFlow:
      return "tensorflow";
    case Framework::kJax:
      return "jax";
    case Framework::kPaddle:
      return "paddle";
    case Framework::kHorovod:
      return "horovod";
    case Framework::kMpi:
      return "mpi";
  }
  return "none";
}

const char* OnFailureName(OnFailure v) {
  switch (v) {
    case OnFailure::kFailJob: return "fail-job";
    case OnFailure::kRestartTask: return "restart-task";
    case OnFailure::kRestartGroup: return "restart-group";
    case OnFailure::kElastic: return "elastic";
  }
  return "fail-job";
}

const char* RestartModeName(RestartMode v) {
  switch (v) {
    case RestartMode::kNever: return "never";
    case RestartMode::kOnFailure: return "on-failure";
    case RestartMode::kAlways: return "always";
  }
  return "never";
}

}  // namespace shoal::spec
