#include "server/request_json.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace specula {
namespace {

using Members = std::vector<std::pair<const std::string, OrderedJson>>;

// Builds the value bottom-up. Each open array or object is a pointer into its parent, which
// does not grow while the child is open, so the pointers on the stack stay valid.
class Builder : public nlohmann::json_sax<OrderedJson> {
 public:
  explicit Builder(absl::string_view what) : what_(what) {}

  bool null() override { return Place(OrderedJson()) != nullptr; }
  bool boolean(bool v) override { return Place(OrderedJson(v)) != nullptr; }
  bool number_integer(number_integer_t v) override { return Place(OrderedJson(v)) != nullptr; }
  bool number_unsigned(number_unsigned_t v) override { return Place(OrderedJson(v)) != nullptr; }
  bool number_float(number_float_t v, const string_t&) override { return Place(OrderedJson(v)) != nullptr; }
  bool string(string_t& v) override { return Place(OrderedJson(std::move(v))) != nullptr; }
  bool binary(binary_t&) override { return Fail("holds binary data"); }

  bool start_object(size_t) override { return Open(OrderedJson::object()); }
  bool start_array(size_t) override { return Open(OrderedJson::array()); }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }

  bool key(string_t& k) override {
    Frame& top = stack_.back();
    if (!top.keys.insert(k).second) {
      return Fail(absl::StrCat("has the key \"", k, "\" twice in one object"));
    }
    if (top.keys.size() > kMaxJsonObjectKeys) {
      return Fail(absl::StrCat("has an object of more than ", kMaxJsonObjectKeys, " members"));
    }
    key_ = std::move(k);
    return true;
  }

  bool parse_error(size_t position, const std::string&, const nlohmann::detail::exception&) override {
    if (error_.ok()) {
      error_ = absl::InvalidArgumentError(
          absl::StrCat(what_, " is not valid JSON (at byte ", position > 0 ? position - 1 : 0, ")"));
    }
    return false;
  }

  absl::StatusOr<OrderedJson> Result() && {
    if (!error_.ok()) return error_;
    return std::move(root_);
  }

 private:
  struct Frame {
    OrderedJson* value;
    absl::flat_hash_set<std::string> keys;  // objects only
  };

  bool Fail(absl::string_view why) {
    error_ = absl::InvalidArgumentError(absl::StrCat(what_, " ", why));
    return false;
  }

  // The new value's place: the root, the next element of the open array, or the member under
  // the key just read (appended: the key was already checked for duplicates).
  OrderedJson* Place(OrderedJson&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    OrderedJson& parent = *stack_.back().value;
    if (parent.is_array()) {
      auto& elements = parent.get_ref<OrderedJson::array_t&>();
      if (elements.size() >= kMaxJsonArrayElements) {
        Fail(absl::StrCat("has an array of more than ", kMaxJsonArrayElements, " elements"));
        return nullptr;
      }
      elements.push_back(std::move(v));
      return &elements.back();
    }
    Members& members = parent.get_ref<OrderedJson::object_t&>();
    members.emplace_back(std::move(key_), std::move(v));
    return &members.back().second;
  }

  bool Open(OrderedJson&& empty) {
    if (static_cast<int>(stack_.size()) >= kMaxJsonDepth) {
      return Fail(absl::StrCat("nests arrays and objects more than ", kMaxJsonDepth,
                               " deep; at most ", kMaxJsonDepth, " allowed"));
    }
    OrderedJson* placed = Place(std::move(empty));
    if (placed == nullptr) return false;
    stack_.push_back(Frame{placed, {}});
    return true;
  }

  bool Close() {
    stack_.pop_back();
    return true;
  }

  std::string what_;
  OrderedJson root_;
  std::vector<Frame> stack_;
  std::string key_;
  absl::Status error_;
};

}  // namespace

absl::StatusOr<OrderedJson> ParseRequestJson(absl::string_view text, absl::string_view what) {
  Builder builder(what);
  const bool ok = OrderedJson::sax_parse(text.begin(), text.end(), &builder,
                                         nlohmann::detail::input_format_t::json, /*strict=*/true);
  absl::StatusOr<OrderedJson> value = std::move(builder).Result();
  if (!ok && value.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON"));
  }
  return value;
}

}  // namespace specula
