// The golden files of the Kubernetes objects' tests (tests/backends/kubernetes/golden): an object
// is compared with its file as pretty JSON; SHOAL_UPDATE_GOLDEN=1 rewrites the files instead,
// for review in the diff.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "common/files.h"
#include "nlohmann/json.hpp"

namespace shoal::backends::golden {

inline std::string GoldenPath(const std::string& name) {
  return std::string(SHOAL_SOURCE_DIR) + "/tests/backends/kubernetes/golden/" + name + ".json";
}

inline void ExpectGolden(const std::string& name, const nlohmann::json& actual) {
  std::string text = actual.dump(2) + "\n";
  if (std::getenv("SHOAL_UPDATE_GOLDEN")) {
    ASSERT_TRUE(WriteFileAtomically(GoldenPath(name), text).ok());
  }
  auto expected = ReadFile(GoldenPath(name));
  ASSERT_TRUE(expected.ok()) << "missing golden file " << GoldenPath(name)
                             << "; run with SHOAL_UPDATE_GOLDEN=1 to create it";
  EXPECT_EQ(*expected, text) << "the object differs from " << GoldenPath(name);
}

}  // namespace shoal::backends::golden
