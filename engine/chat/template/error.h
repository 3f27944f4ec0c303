// Errors inside the interpreter. They are C++ exceptions so that every value operation can fail
// without threading a Status through each call; they never leave this module: Template::Parse and
// Template::Render catch them and return a Status (template.cc: ToStatus).
#pragma once

#include <exception>
#include <string>
#include <utility>

namespace specula::jinja {

class TemplateError : public std::exception {
 public:
  enum class Kind {
    kSyntax,   // found while parsing
    kRuntime,  // a type error, an undefined value used, a limit reached...
    kRaised,   // raise_exception("...") in the template: the message is passed on as is
  };

  explicit TemplateError(std::string message, Kind kind = Kind::kRuntime, int line = 0)
      : message_(std::move(message)), kind_(kind), line_(line) {}

  const char* what() const noexcept override { return message_.c_str(); }
  const std::string& message() const { return message_; }
  Kind kind() const { return kind_; }
  // 1-based template line, 0 when not known yet (the evaluator fills it in).
  int line() const { return line_; }
  void set_line(int line) { line_ = line; }

 private:
  std::string message_;
  Kind kind_;
  int line_;
};

[[noreturn]] inline void ThrowRuntime(std::string message) {
  throw TemplateError(std::move(message), TemplateError::Kind::kRuntime);
}

[[noreturn]] inline void ThrowSyntax(std::string message, int line) {
  throw TemplateError(std::move(message), TemplateError::Kind::kSyntax, line);
}

}  // namespace specula::jinja
