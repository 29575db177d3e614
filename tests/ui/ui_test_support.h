#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/status/status.h"
#include "common/files.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace shoal::ui::testing {

// A fresh directory under the test's temp dir, removed at the end.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "ui-XXXXXX";
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A finished job directory as a master leaves it: spec.yaml, submit.json, status.json.
inline void WriteJob(const std::string& root, const std::string& id, const std::string& state,
                     int64_t created_ms, int64_t finished_ms, int tasks = 2, int restarts = 0,
                     const std::string& reason = "") {
  std::string dir = root + "/" + id;
  ASSERT_TRUE(MakeDirs(dir).ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/spec.yaml", "name: x\n").ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/submit.json", R"({"backend": "local"})").ok());
  nlohmann::json status = {{"job_id", id}, {"name", id.substr(0, id.find('-'))},
                           {"state", state}, {"reason", reason},
                           {"created_unix_ms", created_ms}, {"finished_unix_ms", finished_ms},
                           {"group_restarts", 0}, {"tasks", nlohmann::json::array()}};
  for (int i = 0; i < tasks; ++i) {
    status["tasks"].push_back({{"task", "worker:" + std::to_string(i)}, {"restarts", i == 0 ? restarts : 0}});
  }
  ASSERT_TRUE(WriteFileAtomically(dir + "/status.json", status.dump()).ok());
}

}  // namespace shoal::ui::testing
