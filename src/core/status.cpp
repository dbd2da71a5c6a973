// Status names and formatting (moekit/core/status.h).
#include "moekit/core/status.h"

namespace moekit {

const char* status_code_name(StatusCode c) {
  switch (c) {
    case StatusCode::ok: return "ok";
    case StatusCode::invalid_argument: return "invalid_argument";
    case StatusCode::unsupported: return "unsupported";
    case StatusCode::backend_error: return "backend_error";
    case StatusCode::internal: return "internal";
    case StatusCode::out_of_memory: return "out_of_memory";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

}  // namespace moekit
