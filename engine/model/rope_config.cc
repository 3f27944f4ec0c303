#include "engine/model/rope_config.h"

#include <cmath>
#include <optional>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace specula::model_internal {
namespace {

constexpr const char* kParameters = "rope_parameters";
constexpr const char* kScaling = "rope_scaling";

// The keys every rope object may carry, whatever its type: the type itself (`type` is its older
// name) and the base.
bool IsCommonRopeKey(const std::string& key) {
  return key == "rope_type" || key == "type" || key == "rope_theta";
}

// The keys each rope type may carry besides the common ones (transformers 5's
// _validate_<type>_rope_parameters lists, modeling_rope_utils.py).
const std::set<std::string>& KeysOf(RopeScaling::Type type) {
  static const std::set<std::string> kNone = {};
  static const std::set<std::string> kLinear = {"factor"};
  static const std::set<std::string> kLlama3 = {"factor", "low_freq_factor", "high_freq_factor",
                                                "original_max_position_embeddings"};
  static const std::set<std::string> kYarn = {
      "factor",        "original_max_position_embeddings", "attention_factor", "beta_fast",
      "beta_slow",     "mscale",                           "mscale_all_dim",   "truncate"};
  switch (type) {
    case RopeScaling::Type::kNone:
      return kNone;
    case RopeScaling::Type::kLinear:
      return kLinear;
    case RopeScaling::Type::kLlama3:
      return kLlama3;
    case RopeScaling::Type::kYarn:
      return kYarn;
  }
  return kNone;
}

// The object under `key`, or nullptr when absent or null.
absl::StatusOr<const Json*> OptObject(const ConfigReader& top, const char* key) {
  const Json* v = top.Get(key);
  if (v != nullptr && !v->is_object()) return top.Error(key, "must be an object or null");
  return v;
}

bool SameValue(const Json& a, const Json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}

absl::Status Disagree(const ConfigReader& top, const std::string& a, const Json& va,
                      const std::string& b, const Json& vb) {
  return top.Error(a, absl::StrCat(va.dump(), " disagrees with ", b, " = ", vb.dump(),
                                   " (the two forms of the rotary settings must match)"));
}

// rope_type, else the older `type`; "default" when neither is given and the object holds
// nothing else (transformers' default). A scaling object with other keys but no type is
// refused: its factor would be silently ignored.
absl::StatusOr<std::string> TypeName(const Json& params, const ConfigReader& r) {
  for (const char* key : {"rope_type", "type"}) {
    ASSIGN_OR_RETURN(std::optional<std::string> name, r.OptString(key));
    if (name.has_value()) return *name;
  }
  for (const auto& [key, value] : params.items()) {
    if (!value.is_null() && !IsCommonRopeKey(key)) return r.Error("rope_type", "missing");
  }
  return std::string("default");
}

absl::StatusOr<RopeScaling::Type> ParseType(const std::string& name, const ConfigReader& r) {
  if (name == "default") return RopeScaling::Type::kNone;
  if (name == "linear") return RopeScaling::Type::kLinear;
  if (name == "llama3") return RopeScaling::Type::kLlama3;
  if (name == "yarn") return RopeScaling::Type::kYarn;
  if (name == "dynamic") {
    return r.Error("rope_type",
                   "'dynamic' (NTK) is not supported: transformers recomputes its frequencies "
                   "from the current length, which would change the rotation of keys already "
                   "cached and shared (supported: default, linear, llama3, yarn)");
  }
  return r.Error("rope_type", absl::StrCat("unsupported rope type '", name,
                                           "' (supported: default, linear, llama3, yarn)"));
}

absl::Status RefuseUnknownKeys(const Json& params, RopeScaling::Type type, const ConfigReader& r) {
  const std::set<std::string>& allowed = KeysOf(type);
  for (const auto& [key, value] : params.items()) {
    if (value.is_null() || IsCommonRopeKey(key)) continue;
    if (key == "partial_rotary_factor") continue;  // checked with the top-level key
    if (!allowed.contains(key)) {
      return r.Error(key, "is not a parameter of this rope type (specula cannot honour it)");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<double> Positive(const ConfigReader& r, const char* key) {
  return r.PositiveNumber(key, std::nullopt);
}

absl::Status ReadLlama3(const ConfigReader& r, RopeScaling* s) {
  ASSIGN_OR_RETURN(s->factor, Positive(r, "factor"));
  ASSIGN_OR_RETURN(s->low_freq_factor, Positive(r, "low_freq_factor"));
  ASSIGN_OR_RETURN(s->high_freq_factor, Positive(r, "high_freq_factor"));
  ASSIGN_OR_RETURN(std::optional<int64_t> orig, r.OptInt("original_max_position_embeddings"));
  if (!orig.has_value() || *orig <= 0) {
    return r.Error("original_max_position_embeddings", "must be a positive integer");
  }
  s->original_max_position_embeddings = *orig;
  // The smoothing between the two bands divides by (high - low).
  if (!(s->high_freq_factor > s->low_freq_factor)) {
    return r.Error("high_freq_factor", "must exceed low_freq_factor");
  }
  return absl::OkStatus();
}

// Yarn's attention factor when the config gives none (transformers' get_mscale): 1 for
// factor <= 1, else 0.1 * mscale * ln(factor) + 1.
double YarnMscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

// transformers 5, modeling_rope_utils.py, _compute_yarn_parameters: the attention factor is the
// given one, else the mscale ratio when both mscales are set (non-zero), else get_mscale(factor).
absl::Status ReadYarn(const ConfigReader& r, int64_t max_position_embeddings, RopeScaling* s) {
  ASSIGN_OR_RETURN(s->factor, Positive(r, "factor"));
  ASSIGN_OR_RETURN(std::optional<int64_t> orig, r.OptInt("original_max_position_embeddings"));
  if (orig.has_value() && *orig <= 0) {
    return r.Error("original_max_position_embeddings", "must be a positive integer");
  }
  s->original_max_position_embeddings = orig.value_or(max_position_embeddings);
  // `or 32` / `or 1` in transformers: zero means the default too.
  ASSIGN_OR_RETURN(std::optional<double> beta_fast, r.OptNumber("beta_fast"));
  ASSIGN_OR_RETURN(std::optional<double> beta_slow, r.OptNumber("beta_slow"));
  s->beta_fast = beta_fast.value_or(0) != 0 ? *beta_fast : 32.0;
  s->beta_slow = beta_slow.value_or(0) != 0 ? *beta_slow : 1.0;
  if (!(s->beta_fast > 0 && s->beta_slow > 0)) {
    return r.Error("beta_fast", "beta_fast and beta_slow must be positive");
  }
  ASSIGN_OR_RETURN(std::optional<bool> truncate, r.OptBool("truncate"));
  s->truncate = truncate.value_or(true);
  ASSIGN_OR_RETURN(std::optional<double> attention_factor, r.OptNumber("attention_factor"));
  ASSIGN_OR_RETURN(std::optional<double> mscale, r.OptNumber("mscale"));
  ASSIGN_OR_RETURN(std::optional<double> mscale_all_dim, r.OptNumber("mscale_all_dim"));
  if (attention_factor.has_value()) {
    if (!(*attention_factor > 0)) return r.Error("attention_factor", "must be positive");
    s->attention_factor = *attention_factor;
  } else if (mscale.value_or(0) != 0 && mscale_all_dim.value_or(0) != 0) {
    s->attention_factor = YarnMscale(s->factor, *mscale) / YarnMscale(s->factor, *mscale_all_dim);
  } else {
    s->attention_factor = YarnMscale(s->factor, 1.0);
  }
  if (!(s->attention_factor > 0) || !std::isfinite(s->attention_factor)) {
    return r.Error("mscale", "gives a non-positive attention factor");
  }
  return absl::OkStatus();
}

absl::StatusOr<RopeScaling> ReadScaling(const Json& params, const ConfigReader& r,
                                        int64_t max_position_embeddings) {
  RopeScaling s;
  ASSIGN_OR_RETURN(std::string name, TypeName(params, r));
  ASSIGN_OR_RETURN(s.type, ParseType(name, r));
  RETURN_IF_ERROR(RefuseUnknownKeys(params, s.type, r));
  if (s.type == RopeScaling::Type::kLinear) {
    ASSIGN_OR_RETURN(s.factor, Positive(r, "factor"));
  }
  if (s.type == RopeScaling::Type::kLlama3) RETURN_IF_ERROR(ReadLlama3(r, &s));
  if (s.type == RopeScaling::Type::kYarn) {
    RETURN_IF_ERROR(ReadYarn(r, max_position_embeddings, &s));
  }
  return s;
}

// transformers 5 writes one flat object; models with several attention kinds (Gemma 3, ...)
// write one object per layer type, which no supported architecture uses.
absl::Status RefuseNested(const Json& params, const ConfigReader& top) {
  for (const auto& [key, value] : params.items()) {
    if (value.is_object()) {
      return top.Error(absl::StrCat(kParameters, ".", key),
                       "per-layer-type rope parameters are not supported (no supported "
                       "architecture uses them)");
    }
  }
  return absl::OkStatus();
}

// rope_parameters and rope_scaling both given: every scaling key either holds must agree.
absl::Status CheckScalingAgrees(const Json& params, const Json& legacy, const ConfigReader& top) {
  const ConfigReader pr = top.Nested(params, ""), lr = top.Nested(legacy, "");
  ASSIGN_OR_RETURN(std::string params_type, TypeName(params, pr));
  ASSIGN_OR_RETURN(std::string legacy_type, TypeName(legacy, lr));
  if (params_type != legacy_type) {
    return Disagree(top, absl::StrCat(kParameters, ".rope_type"), params_type,
                    absl::StrCat(kScaling, ".rope_type"), legacy_type);
  }
  std::set<std::string> keys;
  for (const Json* obj : {&params, &legacy}) {
    for (const auto& [key, value] : obj->items()) {
      if (!value.is_null() && !IsCommonRopeKey(key)) keys.insert(key);
    }
  }
  for (const std::string& key : keys) {
    const Json* a = pr.Get(key);
    const Json* b = lr.Get(key);
    if (a == nullptr || b == nullptr || !SameValue(*a, *b)) {
      return Disagree(top, absl::StrCat(kParameters, ".", key), a ? *a : Json(),
                      absl::StrCat(kScaling, ".", key), b ? *b : Json());
    }
  }
  return absl::OkStatus();
}

// The one value of a setting that may sit in the parameters object and at the top level.
absl::StatusOr<const Json*> OneOf(const Json* params, const char* params_name, const char* key,
                                  const ConfigReader& top) {
  const Json* inner = nullptr;
  if (params != nullptr) {
    auto it = params->find(key);
    if (it != params->end() && !it->is_null()) inner = &*it;
  }
  const Json* outer = top.Get(key);
  if (inner != nullptr && outer != nullptr && !SameValue(*inner, *outer)) {
    return Disagree(top, absl::StrCat(params_name, ".", key), *inner, key, *outer);
  }
  return inner != nullptr ? inner : outer;
}

absl::Status RefusePartialRotary(const Json* params, const char* params_name,
                                 const ConfigReader& top) {
  ASSIGN_OR_RETURN(const Json* v, OneOf(params, params_name, "partial_rotary_factor", top));
  if (v != nullptr && !(v->is_number() && v->get<double>() == 1.0)) {
    return top.Error("partial_rotary_factor",
                     absl::StrCat(v->dump(), ": partial rotary embeddings are not supported"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RopeSettings> ParseRopeSettings(const Json& root, const ConfigReader& top,
                                               int64_t max_position_embeddings) {
  ASSIGN_OR_RETURN(const Json* params, OptObject(top, kParameters));
  ASSIGN_OR_RETURN(const Json* legacy, OptObject(top, kScaling));
  if (params != nullptr) RETURN_IF_ERROR(RefuseNested(*params, top));
  if (params != nullptr && legacy != nullptr) {
    RETURN_IF_ERROR(CheckScalingAgrees(*params, *legacy, top));
  }
  const Json* scaling = params != nullptr ? params : legacy;
  const char* scaling_name = params != nullptr ? kParameters : kScaling;
  RopeSettings out;
  ASSIGN_OR_RETURN(const Json* theta, OneOf(params, kParameters, "rope_theta", top));
  if (theta != nullptr) {
    if (!theta->is_number() || !(theta->get<double>() > 0)) {
      return top.Error(theta == top.Get("rope_theta") ? "rope_theta" : "rope_parameters.rope_theta",
                       "must be a positive number");
    }
    out.theta = theta->get<double>();
  }
  RETURN_IF_ERROR(RefusePartialRotary(scaling, scaling_name, top));
  if (scaling == nullptr) return out;
  // transformers 5 (standardize_rope_params) lets a top-level original_max_position_embeddings
  // win over the one inside; here the two must agree.
  Json merged = *scaling;
  ASSIGN_OR_RETURN(const Json* orig,
                   OneOf(scaling, scaling_name, "original_max_position_embeddings", top));
  const ConfigReader r = top.Nested(merged, absl::StrCat(scaling_name, "."));
  ASSIGN_OR_RETURN(std::string type, TypeName(merged, r));
  if (orig != nullptr && (type == "llama3" || type == "yarn")) {
    merged["original_max_position_embeddings"] = *orig;
  }
  ASSIGN_OR_RETURN(out.scaling, ReadScaling(merged, r, max_position_embeddings));
  return out;
}

}  // namespace specula::model_internal
