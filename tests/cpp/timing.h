// Bounds on how long an op took, set by the op's own timeout, for tests that
// run under `ctest -j` on a loaded 2-core machine.
//
// Note [Timing bounds in tests]
// The suites run under `ctest -j` on machines of 2 cores shared with other
// jobs, where a thread that is ready can wait a second or more for a core
// (test_core_hier's lost-host bound of 1 s was missed so once). So no test
// bounds how long an op took by an absolute constant of about a second; each
// bound follows from the op's own timeout t:
// - an op that must end by timing out ends no sooner than t (where the test
//   starts its clock before the op sets its deadline) and no later than
//   timeoutBound(t) = t + max(2 s, 2 t): room for a loaded machine, while a
//   timeout that never fires, or fires at another, longer deadline, still
//   fails the test (and the test's own hang guards are longer than that);
// - an op that must end early (an abort, a peer that left or gave up, an error
//   another rank saw), not at its deadline, ends before earlyBound(t) = t / 2,
//   half the timeout it would otherwise have reached. Such tests give the op a
//   timeout of 10 s or more, so that the bound leaves seconds of room and the
//   op's own timeout still falls well after it.
// A bound that only measured speed is not a test of behaviour: the speed is
// measured in benchmarks/ (tree_allreduce, for the oversubscribed tree).
// tests/python/harness.py has the same two bounds (timeout_bound, early_bound).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>

namespace braid {
namespace testing {

using std::chrono::milliseconds;

// The latest an op with timeout `t` may end when it must end by timing out.
inline milliseconds timeoutBound(milliseconds t) {
  return t + std::max(milliseconds(2000), 2 * t);
}

// The latest an op with timeout `t` may end when it must end early, not at its deadline.
inline milliseconds earlyBound(milliseconds t) { return t / 2; }

inline double msOf(std::chrono::duration<double, std::milli> d) { return d.count(); }

// EXPECT_TRUE(timedOut(took, t)): an op that timed out after `t` took at least
// `t` (or `lower`, where its deadline was set before the test's clock started)
// and at most timeoutBound(t).
template <class Rep, class Period>
::testing::AssertionResult timedOut(std::chrono::duration<Rep, Period> took, milliseconds t,
                                    milliseconds lower) {
  if (took >= lower && took <= timeoutBound(t)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "took " << msOf(took) << " ms; an op that times out after " << t.count()
         << " ms must take " << lower.count() << " to " << timeoutBound(t).count() << " ms";
}

template <class Rep, class Period>
::testing::AssertionResult timedOut(std::chrono::duration<Rep, Period> took, milliseconds t) {
  return timedOut(took, t, t);
}

// EXPECT_TRUE(endedByTimeout(took, t)): an op with timeout `t` that may fail
// at its deadline or sooner (another rank's timeout or abort reached it first)
// took at most timeoutBound(t).
template <class Rep, class Period>
::testing::AssertionResult endedByTimeout(std::chrono::duration<Rep, Period> took,
                                          milliseconds t) {
  if (took <= timeoutBound(t)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "took " << msOf(took) << " ms; an op with a timeout of " << t.count()
         << " ms must end within " << timeoutBound(t).count() << " ms";
}

// EXPECT_TRUE(endedEarly(took, t)): an op with timeout `t` that must end
// early (not at its deadline) took less than earlyBound(t).
template <class Rep, class Period>
::testing::AssertionResult endedEarly(std::chrono::duration<Rep, Period> took, milliseconds t) {
  if (took < earlyBound(t)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "took " << msOf(took) << " ms; an op that must end before its timeout of "
         << t.count() << " ms must end within " << earlyBound(t).count() << " ms";
}

}  // namespace testing
}  // namespace braid
