// A void() callable held inline, with no heap allocation: for work queued every step (the CPU
// copy stream's launches), where std::function would allocate for any capture larger than two
// pointers or not trivially copyable. It takes trivially copyable callables (lambdas capturing
// pointers, spans and numbers) of at most kBytes, checked when it is built. Copies copy the bytes
// with memcpy, which creates the callable in the new storage (it is trivially copyable).
#pragma once

#include <cstddef>
#include <cstring>
#include <new>
#include <type_traits>

#include "engine/common/check.h"

namespace specula {

class InlineFunction {
 public:
  static constexpr size_t kBytes = 64;

  InlineFunction() = default;
  template <typename F,
            typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, InlineFunction>>>
  InlineFunction(F f) {  // NOLINT(google-explicit-constructor): passed like a lambda
    static_assert(std::is_trivially_copyable_v<F>,
                  "InlineFunction holds trivially copyable callables only (no owning captures)");
    static_assert(sizeof(F) <= kBytes && alignof(F) <= alignof(std::max_align_t),
                  "the callable's captures exceed InlineFunction::kBytes");
    ::new (static_cast<void*>(storage_)) F(f);
    invoke_ = [](const void* storage) { (*std::launder(reinterpret_cast<const F*>(storage)))(); };
  }

  InlineFunction(const InlineFunction& other) { *this = other; }
  InlineFunction& operator=(const InlineFunction& other) {
    if (this != &other) {
      std::memcpy(storage_, other.storage_, kBytes);
      invoke_ = other.invoke_;
    }
    return *this;
  }

  explicit operator bool() const { return invoke_ != nullptr; }
  // Calling an empty one is a bug (CHECKed).
  void operator()() const {
    CHECK(invoke_ != nullptr) << "an empty InlineFunction was called";
    invoke_(storage_);
  }

 private:
  alignas(std::max_align_t) unsigned char storage_[kBytes] = {};
  void (*invoke_)(const void*) = nullptr;
};

}  // namespace specula
