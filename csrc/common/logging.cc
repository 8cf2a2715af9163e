#include "common/logging.h"

#include <cstdio>
#include <string>

#include "common/settings.h"

namespace braid {

BRAID_SETTING_STRING(kLogLevel, "BRAID_LOG_LEVEL", "warn",
                     "Log level: error, warn, info, debug or trace.");

LogLevel logLevel() {
  // Read once: logging sits on hot paths.
  static const LogLevel level = [] {
    std::string v = kLogLevel.get();
    if (v == "error") return LogLevel::kError;
    if (v == "info") return LogLevel::kInfo;
    if (v == "debug") return LogLevel::kDebug;
    if (v == "trace") return LogLevel::kTrace;
    return LogLevel::kWarn;
  }();
  return level;
}

LogLine::LogLine(LogLevel level, const char* tag, int rank) {
  static const char kLetters[] = "EWIDT";
  os_ << "[braid ";
  if (rank >= 0) os_ << "rank " << rank << ' ';  // -1: no rank (a process-wide line)
  os_ << tag << ' ' << kLetters[static_cast<int>(level)] << "] ";
}

LogLine::~LogLine() {
  os_ << '\n';
  std::string s = os_.str();
  std::fwrite(s.data(), 1, s.size(), stderr);
}

}  // namespace braid
