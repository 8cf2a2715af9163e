// Errors are exceptions that carry the op, the rank and the values involved.
//
//   BRAID_ENFORCE(a == b, "allreduce", rank, "rank 1 sent ", a, " elements, expected ", b);
//
// throws braid::Error("braid allreduce (rank 0): rank 1 sent 3 elements, expected 4").
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace braid {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A peer did not arrive within the deadline.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A peer died, left the group, or the group was shut down: the ranks are out
// of step and the group cannot be used again.
class PeerLostError : public Error {
 public:
  using Error::Error;
};

namespace detail {
inline void appendAll(std::ostringstream&) {}
template <typename T, typename... Rest>
void appendAll(std::ostringstream& os, const T& v, const Rest&... rest) {
  os << v;
  appendAll(os, rest...);
}
}  // namespace detail

template <typename... Args>
std::string strCat(const Args&... args) {
  std::ostringstream os;
  detail::appendAll(os, args...);
  return os.str();
}

template <typename... Args>
std::string errorText(const char* op, int rank, const Args&... args) {
  return strCat("braid ", op, " (rank ", rank, "): ", args...);
}

}  // namespace braid

#define BRAID_THROW(ExcType, op, rank, ...) throw ExcType(::braid::errorText(op, rank, __VA_ARGS__))

#define BRAID_ENFORCE(cond, op, rank, ...)                  \
  do {                                                      \
    if (!(cond)) BRAID_THROW(::braid::Error, op, rank, __VA_ARGS__); \
  } while (0)
