// moekit/core/status.h: the error type every entry point returns.
//
// A Status is ok or carries a code and a human-readable message that names the offending argument
// and value ("topk_ids: dtype must be i32, got f32"). Nothing in moekit throws across the API.
#pragma once

#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace moekit {

enum class StatusCode : int {
  ok = 0,
  invalid_argument,  // the caller passed something the contract forbids
  unsupported,       // valid, but no kernel (or not this kernel) can run it
  backend_error,     // a backend runtime failed (CUDA error, no device, ...)
  internal,          // a bug in moekit
  out_of_memory,     // a host or device allocation the call needs failed (the size is in the message)
};

const char* status_code_name(StatusCode c);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::ok; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid_argument: topk_ids: dtype must be i32, got f32"
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::ok;
  std::string message_;
};

namespace status_detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace status_detail

// Builders that stream their arguments into the message.
template <class... Args>
Status InvalidArgument(const Args&... args) {
  return Status(StatusCode::invalid_argument, status_detail::concat(args...));
}
template <class... Args>
Status Unsupported(const Args&... args) {
  return Status(StatusCode::unsupported, status_detail::concat(args...));
}
template <class... Args>
Status BackendError(const Args&... args) {
  return Status(StatusCode::backend_error, status_detail::concat(args...));
}
template <class... Args>
Status OutOfMemory(const Args&... args) {
  return Status(StatusCode::out_of_memory, status_detail::concat(args...));
}
template <class... Args>
Status Internal(const Args&... args) {
  return Status(StatusCode::internal, status_detail::concat(args...));
}

// Runs fn() (which returns a Status) and turns an exception into one, so that nothing throws
// across the API: std::bad_alloc and std::length_error (a size the machine cannot hold) become
// OutOfMemory "<what>: out of host memory", anything else Internal "<what>: unexpected exception:
// ...". describe() names the call (a kernel and its shape, a file) and runs only on an exception.
template <class Fn, class Describe>
Status status_of(Fn&& fn, const Describe& describe) noexcept {
  try {
    try {
      return fn();
    } catch (const std::bad_alloc&) {
      return OutOfMemory(describe(), ": out of host memory");
    } catch (const std::length_error& e) {
      return OutOfMemory(describe(), ": out of host memory (", e.what(), ")");
    } catch (const std::exception& e) {
      return Internal(describe(), ": unexpected exception: ", e.what());
    } catch (...) {
      return Internal(describe(), ": unexpected non-standard exception");
    }
  } catch (...) {  // describe() itself could not allocate
    return Status(StatusCode::out_of_memory, std::string());
  }
}

}  // namespace moekit

#define MOEKIT_RETURN_IF_ERROR(expr)            \
  do {                                          \
    ::moekit::Status moekit_status_ = (expr);   \
    if (!moekit_status_.ok()) return moekit_status_; \
  } while (0)
