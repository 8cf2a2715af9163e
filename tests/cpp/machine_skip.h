// BRAID_MACHINE_SKIP(why): a test that this machine cannot run (no root for a mount
// namespace, direct reads not permitted) skips saying why; under CI (CI=true, or
// BRAID_STRICT_SKIPS=1; BRAID_STRICT_SKIPS=0 turns it off) it fails instead, because CI's
// machine runs as root and can run it: there the skip would hide a regression. The same
// rule as harness.machine_skip in the Python suites (Note [Expected skips] in
// tests/python/skips.py). Use it in the test body, where GTEST_SKIP could be.
#pragma once

#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <string>

namespace braid {
namespace testing {

inline bool strictSkips() {
  const char* s = std::getenv("BRAID_STRICT_SKIPS");
  if (s && (std::string(s) == "0" || std::string(s) == "1")) return std::string(s) == "1";
  std::string ci = std::getenv("CI") ? std::getenv("CI") : "";
  for (char& c : ci) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ci == "true" || ci == "1" || ci == "yes";
}

}  // namespace testing
}  // namespace braid

#define BRAID_MACHINE_SKIP(why)                                                          \
  do {                                                                                   \
    if (::braid::testing::strictSkips())                                                 \
      GTEST_FAIL() << (why)                                                              \
                   << " (a skip that depends on the machine fails under CI=true or "     \
                      "BRAID_STRICT_SKIPS=1)";                                           \
    GTEST_SKIP() << (why);                                                               \
  } while (0)
