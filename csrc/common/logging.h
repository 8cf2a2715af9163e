// Log lines carry the rank and a subsystem tag, and are filtered by level
// (BRAID_LOG_LEVEL: error, warn, info, debug, trace; default warn):
//
//   BRAID_LOG(kInfo, "shm", rank) << "mapped " << n << " segments";
//   -> "[braid rank 0 shm I] mapped 4 segments"
// A rank of -1 (a line about the whole process) leaves the rank out:
// "[braid settings W] ...".
#pragma once

#include <sstream>

namespace braid {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3, kTrace = 4 };

LogLevel logLevel();

class LogLine {
 public:
  LogLine(LogLevel level, const char* tag, int rank);
  ~LogLine();
  template <typename T>
  LogLine& operator<<(const T& v) {
    os_ << v;
    return *this;
  }

 private:
  std::ostringstream os_;
};

}  // namespace braid

#define BRAID_LOG(level, tag, rank)                                                         \
  if (static_cast<int>(::braid::LogLevel::level) > static_cast<int>(::braid::logLevel())) { \
  } else                                                                                    \
    ::braid::LogLine(::braid::LogLevel::level, tag, rank)
