// Typed reads of one config.json object for the model configuration parsers: errors name the
// file and the key. Internal to engine/model.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "nlohmann/json.hpp"

namespace specula::model_internal {

using Json = nlohmann::json;

// Reads keys of one JSON object, producing errors that name the file and the key. Null counts
// as absent throughout: HF configs write `"head_dim": null`, `"rope_scaling": null`, etc.
class ConfigReader {
 public:
  // `prefix` is put before every key in messages ("rope_parameters." for a nested object).
  ConfigReader(const Json& obj, const std::string& source, std::string prefix = "")
      : obj_(obj), source_(source), prefix_(std::move(prefix)) {}

  // A reader of a nested object whose messages name its keys "<this prefix><prefix><key>".
  ConfigReader Nested(const Json& obj, const std::string& prefix) const {
    return ConfigReader(obj, source_, prefix_ + prefix);
  }

  absl::Status Error(absl::string_view key, absl::string_view msg) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", prefix_, key, ": ", msg));
  }

  // Whether the key is present at all, null included.
  bool Contains(const std::string& key) const { return obj_.contains(key); }

  const Json* Get(const std::string& key) const {
    auto it = obj_.find(key);
    return (it == obj_.end() || it->is_null()) ? nullptr : &*it;
  }

  absl::StatusOr<std::optional<int64_t>> OptInt(const std::string& key) const {
    const Json* v = Get(key);
    if (v == nullptr) return std::optional<int64_t>();
    if (!v->is_number_integer() || (v->is_number_unsigned() && v->get<uint64_t>() > INT64_MAX)) {
      return Error(key, "must be an integer");
    }
    return std::optional<int64_t>(v->get<int64_t>());
  }

  // A size in [1, max]; `fallback` when absent, required when no fallback. Sizes are int32 in
  // kernels and the API, so the default bound is INT32_MAX: a larger value is refused, never cut.
  absl::StatusOr<int64_t> PositiveInt(const std::string& key,
                                      std::optional<int64_t> fallback = std::nullopt,
                                      int64_t max = std::numeric_limits<int32_t>::max()) const {
    ASSIGN_OR_RETURN(std::optional<int64_t> v, OptInt(key));
    if (!v.has_value()) {
      if (fallback.has_value()) return *fallback;
      return Error(key, "required key is missing");
    }
    if (*v <= 0) return Error(key, absl::StrCat("must be positive, got ", *v));
    if (*v > max) return Error(key, absl::StrCat("must be at most ", max, ", got ", *v));
    return *v;
  }

  absl::StatusOr<std::optional<double>> OptNumber(const std::string& key) const {
    const Json* v = Get(key);
    if (v == nullptr) return std::optional<double>();
    if (!v->is_number()) return Error(key, "must be a number");
    return std::optional<double>(v->get<double>());
  }

  absl::StatusOr<double> PositiveNumber(const std::string& key,
                                        std::optional<double> fallback) const {
    ASSIGN_OR_RETURN(std::optional<double> v, OptNumber(key));
    if (!v.has_value()) {
      if (fallback.has_value()) return *fallback;
      return Error(key, "required key is missing");
    }
    if (!(*v > 0)) return Error(key, absl::StrCat("must be positive, got ", *v));
    return *v;
  }

  absl::StatusOr<std::optional<bool>> OptBool(const std::string& key) const {
    const Json* v = Get(key);
    if (v == nullptr) return std::optional<bool>();
    if (!v->is_boolean()) return Error(key, "must be true or false");
    return std::optional<bool>(v->get<bool>());
  }

  absl::StatusOr<std::optional<std::string>> OptString(const std::string& key) const {
    const Json* v = Get(key);
    if (v == nullptr) return std::optional<std::string>();
    if (!v->is_string()) return Error(key, "must be a string");
    return std::optional<std::string>(v->get<std::string>());
  }

  // `eos_token_id`: an int or a list of ints.
  absl::StatusOr<std::vector<int64_t>> IntOrList(const std::string& key) const {
    std::vector<int64_t> out;
    const Json* v = Get(key);
    if (v == nullptr) return out;
    if (v->is_array()) {
      for (const Json& e : *v) {
        if (!e.is_number_integer() || e.get<int64_t>() < 0) {
          return Error(key, "must be a non-negative integer or a list of them");
        }
        out.push_back(e.get<int64_t>());
      }
      return out;
    }
    ASSIGN_OR_RETURN(std::optional<int64_t> one, OptInt(key));
    if (*one < 0) return Error(key, "must be non-negative");
    out.push_back(*one);
    return out;
  }

  absl::StatusOr<std::optional<int64_t>> OptTokenId(const std::string& key) const {
    ASSIGN_OR_RETURN(std::optional<int64_t> v, OptInt(key));
    if (v.has_value() && *v < 0) return Error(key, "must be non-negative");
    return v;
  }

 private:
  const Json& obj_;
  const std::string& source_;
  std::string prefix_;
};

}  // namespace specula::model_internal
