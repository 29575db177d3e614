#pragma once

#include <cstdint>
#include <string>

#include "nlohmann/json.hpp"

namespace shoal::ui {

// Fields of files the UI reads but does not own (status.json, journals, samples): a field of the
// wrong type reads as absent instead of throwing, so that one odd file never breaks a page.
inline std::string StrField(const nlohmann::json& j, const char* key, const std::string& fallback = "") {
  if (!j.is_object()) return fallback;
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}

inline int64_t IntField(const nlohmann::json& j, const char* key, int64_t fallback = 0) {
  if (!j.is_object()) return fallback;
  auto it = j.find(key);
  if (it == j.end()) return fallback;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_number_float()) return static_cast<int64_t>(it->get<double>());
  return fallback;
}

}  // namespace shoal::ui
