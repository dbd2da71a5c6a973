// What the model loaders (safetensors, tokenizer, config, runner) and `moekit eval --data` share to
// read untrusted files without hanging, throwing or exhausting memory (issue 28):
//   - read_regular_file: a whole file, only when it is a regular file after following links (a
//     directory, FIFO, socket or device -- /dev/zero included -- is refused before it is opened, so
//     nothing blocks), never more than a cap (checked on the size, then while reading: a file that
//     grows stops at cap + 1 bytes);
//   - check_json_depth: rejects JSON nested deeper than kMaxJsonDepth before nlohmann parses it
//     (its dump() and comparisons recurse; a deep file would overflow the stack);
//   - short_dump: a JSON value for an error message, cut to ~100 characters;
//   - no_throw: runs a loader body and turns std::bad_alloc into OutOfMemory and any other exception
//     into Internal, so nothing throws across the API.
// Every message names the file's role (`what`: "config.json", "--data", ...) and the path.
// Tests: tests/test_model_runner.cpp (ModelRunner.Rejects*), tests/test_tokenizer.cpp,
// tests/test_safetensors.cpp.
#pragma once

#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/core/status.h"

namespace moekit::model {

constexpr uint64_t kMaxJsonFileBytes = uint64_t(64) << 20;  // config.json, tokenizer.json: 64 MiB
constexpr int kMaxJsonDepth = 64;                           // arrays / objects inside each other
constexpr uint64_t kNoSizeCap = ~uint64_t(0);               // safetensors: any size the machine can hold

// Reads the regular file `path` (links followed) into *out, at most max_bytes. *out is untouched on
// error. `what` prefixes the messages: "config.json: /m/config.json is a directory, not a regular
// file", "... is 70.0 MB, over the 64 MiB limit". A buffer the machine cannot allocate is OutOfMemory.
Status read_regular_file(const std::string& what, const std::string& path, uint64_t max_bytes, std::string* out);
Status read_regular_file(const std::string& what, const std::string& path, uint64_t max_bytes,
                         std::vector<uint8_t>* out);

// InvalidArgument "<what>: JSON nested deeper than 64 levels (at byte N)" when the arrays and objects
// of text[0, n) (brackets outside strings, escapes honoured) nest deeper than max_depth.
Status check_json_depth(const std::string& what, const char* text, size_t n, int max_depth = kMaxJsonDepth);

// The value's JSON text, cut to `max_chars` characters with "..." (for error messages).
std::string short_dump(const nlohmann::json& v, size_t max_chars = 100);

// fn() with every exception turned into a Status naming `what`: OutOfMemory for std::bad_alloc and
// std::length_error (a size past what a container can hold), Internal for anything else.
template <class Fn>
Status no_throw(const std::string& what, Fn&& fn) noexcept {
  return status_of(std::forward<Fn>(fn), [&]() -> const std::string& { return what; });
}

}  // namespace moekit::model
