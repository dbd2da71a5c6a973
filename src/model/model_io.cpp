// Reading untrusted model files (src/model/model_io.h): regular files only, size caps, a JSON depth
// bound before parsing, short value dumps for messages.
#include "model/model_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace moekit::model {

namespace {

// "a directory", "a FIFO", ... for a file that is not regular.
const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a plain file";
}

// 73400320 -> "73.4 MB" (decimal units, one decimal).
std::string size_text(uint64_t bytes) {
  char buf[32];
  if (bytes < 1000) {
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(bytes));
  } else {
    const char* units[] = {"kB", "MB", "GB", "TB", "PB", "EB"};
    double v = double(bytes) / 1000.0;
    int u = 0;
    while (v >= 1000.0 && u < 5) v /= 1000.0, ++u;
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  }
  return buf;
}

// A cap as written in the code: "64 MiB" when it is a whole number of MiB.
std::string cap_text(uint64_t bytes) {
  if (bytes % (uint64_t(1) << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes) + " bytes";
}

// Closes the descriptor on every return path.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

template <class Buf>
Status read_into(const std::string& what, const std::string& path, uint64_t max_bytes, Buf* out) {
  if (path.empty()) return InvalidArgument(what, ": empty path");
  // stat BEFORE open: opening a FIFO for reading blocks until a writer appears.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return InvalidArgument(what, ": cannot open '", path, "': ", std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgument(what, ": ", path, " is ", file_kind(st.st_mode), ", not a regular file");
  }
  const uint64_t size = uint64_t(st.st_size);
  if (size > max_bytes) {
    return InvalidArgument(what, ": ", path, " is ", size_text(size), ", over the ", cap_text(max_bytes), " limit");
  }
  // O_NONBLOCK: if the path was swapped for a FIFO since the stat, open does not wait either.
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (f.fd < 0) return InvalidArgument(what, ": cannot open '", path, "': ", std::strerror(errno));
  if (::fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return InvalidArgument(what, ": ", path, " changed while opened, not a regular file");
  }
  // Read at most limit + 1 bytes: one more than allowed says the file grew past what was checked.
  const uint64_t limit = max_bytes == kNoSizeCap ? uint64_t(st.st_size) : max_bytes;
  Buf buf;
  const Status s = no_throw(what, [&]() -> Status {
    buf.resize(size_t(std::min<uint64_t>(uint64_t(st.st_size), limit) + 1));
    size_t got = 0;
    while (true) {
      if (got == buf.size()) {
        if (uint64_t(got) > limit) break;
        buf.resize(size_t(std::min<uint64_t>(uint64_t(buf.size()) * 2, limit + 1)));
      }
      const ssize_t r = ::read(f.fd, reinterpret_cast<char*>(&buf[0]) + got, buf.size() - got);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return InvalidArgument(what, ": cannot read '", path, "': ", std::strerror(errno));
      if (r == 0) break;
      got += size_t(r);
    }
    if (uint64_t(got) > limit) {
      return max_bytes == kNoSizeCap
                 ? InvalidArgument(what, ": ", path, " grew past its size of ", size_text(limit), " while being read")
                 : InvalidArgument(what, ": ", path, " grew past the ", cap_text(max_bytes), " limit while being read");
    }
    buf.resize(got);
    *out = std::move(buf);
    return Status::Ok();
  });
  if (s.code() == StatusCode::out_of_memory) {
    return OutOfMemory(what, ": ", path, " (", size_text(size), ") does not fit in this machine's memory");
  }
  return s;
}

}  // namespace

Status read_regular_file(const std::string& what, const std::string& path, uint64_t max_bytes, std::string* out) {
  return read_into(what, path, max_bytes, out);
}

Status read_regular_file(const std::string& what, const std::string& path, uint64_t max_bytes,
                         std::vector<uint8_t>* out) {
  return read_into(what, path, max_bytes, out);
}

Status check_json_depth(const std::string& what, const char* text, size_t n, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < n; ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return InvalidArgument(what, ": JSON nested deeper than ", max_depth, " levels (at byte ", i, ")");
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return Status::Ok();
}

std::string short_dump(const nlohmann::json& v, size_t max_chars) {
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() <= max_chars) return s;
  size_t cut = max_chars;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 character
  s.resize(cut);
  return s + "...";
}

}  // namespace moekit::model
