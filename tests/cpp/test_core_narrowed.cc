// The allreduce on a 16-bit wire (Note [Allreduce on a narrower wire]), ranks
// as threads: against the closed form of the fp16/bf16 compression hooks
// (each rank's value divided and rounded, the sum in float32 in rank order,
// rounded once, widened), and ranks whose ops differ.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "collectives/shm/collectives.h"
#include "core_group.h"
#include "memory_store.h"
#include "math/cast.h"
#include "math/half.h"

namespace braid {
namespace {

using collectives::Communicator;
using collectives::OpDesc;
using collectives::OpKind;
using testing::desc;
using testing::Group;
using testing::runRanks;

OpDesc narrowed(size_t count, DataType wire, float divisor) {
  OpDesc d = desc(OpKind::kAllreduce, count);
  d.wire = wire;
  d.wireDivisor = divisor;
  return d;
}

// Values with bits below 16-bit precision, of both signs, a few large.
float input(int rank, size_t i) {
  const float v = std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(rank));
  return (i % 97 == 5) ? v * 60000.f : v * 3.14159f;
}

uint16_t round16(float f, DataType wire) {
  return wire == DataType::kBFloat16 ? reduce::floatToBf16(f) : reduce::floatToHalf(f);
}
float widen16(uint16_t b, DataType wire) {
  return wire == DataType::kBFloat16 ? reduce::bf16ToFloat(b) : reduce::halfToFloat(b);
}

float closedForm(int n, size_t i, DataType wire, float divisor) {
  float sum = 0;
  for (int q = 0; q < n; ++q) {
    const float part = widen16(round16(input(q, i) / divisor, wire), wire);
    sum = q == 0 ? part : sum + part;
  }
  return widen16(round16(sum, wire), wire);
}

// The SIMD loops against the scalar rounding, on random bit patterns (every
// exponent, NaN, inf, subnormals, ties) and a length that leaves a tail.
TEST(CastLoops, RoundAsTorchDoes) {
  std::vector<float> x(100003);
  uint32_t state = 12345;
  for (float& v : x) {
    state = state * 1664525u + 1013904223u;
    v = reduce::bitsFloat(state);
  }
  x[0] = 1.f + 0x1p-8f;  // a tie for bf16: rounds to even
  x[1] = 65520.f;        // overflows fp16
  for (DataType wire : {DataType::kBFloat16, DataType::kFloat16}) {
    for (float divisor : {1.f, 2.f, 3.f, 7.f}) {
      std::vector<uint16_t> got(x.size());
      reduce::narrowDivided(x.data(), got.data(), x.size(), divisor, wire);
      for (size_t i = 0; i < x.size(); ++i) {
        const float q = x[i] / divisor;
        if (q != q) {  // torch's bf16 NaN is 0x7fc0; fp16 keeps a quiet NaN
          ASSERT_TRUE(std::isnan(widen16(got[i], wire))) << i;
          if (wire == DataType::kBFloat16) {
            ASSERT_EQ(got[i], 0x7fc0) << i;
          }
          continue;
        }
        ASSERT_EQ(got[i], round16(q, wire)) << toString(wire) << " / " << divisor << " at " << i
                                            << ": " << q;
      }
      std::vector<float> back(x.size(), 1.f);
      reduce::widen(got.data(), back.data(), x.size(), wire, false);
      for (size_t i = 0; i < x.size(); ++i) {
        const float want = widen16(got[i], wire);
        ASSERT_TRUE(back[i] == want || (std::isnan(back[i]) && std::isnan(want))) << i;
      }
    }
  }
}

class Narrowed : public ::testing::TestWithParam<int> {};

TEST_P(Narrowed, MatchesTheHooksClosedForm) {
  const int n = GetParam();
  Group g(n, testing::slots(4096));  // 2048 wire values per chunk: several chunks below
  for (DataType wire : {DataType::kBFloat16, DataType::kFloat16}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{2049}, size_t{10007}}) {
      runRanks(n, [&](int r) {
        Communicator& c = *g.comms[r];
        std::vector<float> in(count), out(count, -1.f);
        for (size_t i = 0; i < count; ++i) in[i] = input(r, i);
        const float divisor = static_cast<float>(n);
        // out of place, then in place
        collectives::allreduce(c, narrowed(count, wire, divisor), in.data(), out.data());
        collectives::allreduce(c, narrowed(count, wire, divisor), in.data(), in.data());
        for (size_t i = 0; i < count; ++i) {
          const float want = closedForm(n, i, wire, divisor);
          ASSERT_EQ(out[i], want) << toString(wire) << " rank " << r << " count " << count
                                  << " element " << i;
          ASSERT_EQ(in[i], want) << "in place, " << toString(wire) << " element " << i;
        }
      });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, Narrowed, ::testing::Values(1, 2, 3, 4, 5));

// One rank's op against another's: every rank throws the same kind of error,
// naming both sides, and the group still works.
void expectMismatch(const std::function<OpDesc(int rank)>& op, const std::string& needle) {
  const int n = 3;
  Group g(n, testing::slots(4096));
  std::vector<std::string> errors(n);
  runRanks(n, [&](int r) {
    Communicator& c = *g.comms[r];
    std::vector<float> buf(100, 1.f);
    try {
      collectives::allreduce(c, op(r), buf.data(), buf.data());
    } catch (const Error& e) {
      errors[r] = e.what();
    }
    std::vector<float> ok(4, 1.f);
    collectives::allreduce(c, desc(OpKind::kAllreduce, 4), ok.data(), ok.data());
    EXPECT_EQ(ok[0], 3.f);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(errors[r].find("braid allreduce (rank " + std::to_string(r) + ")"),
              std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find(needle), std::string::npos) << errors[r];
  }
}

TEST(NarrowedErrors, NarrowedAgainstPlainFailsEveryRank) {
  expectMismatch(
      [](int r) {
        return r == 1 ? desc(OpKind::kAllreduce, 100) : narrowed(100, DataType::kBFloat16, 3.f);
      },
      "values divided by 3 as bfloat16");
}

TEST(NarrowedErrors, WireTypesMustAgree) {
  expectMismatch(
      [](int r) { return narrowed(100, r == 2 ? DataType::kFloat16 : DataType::kBFloat16, 3.f); },
      "as float16");
}

TEST(NarrowedErrors, DivisorsMustAgree) {
  expectMismatch(
      [](int r) { return narrowed(100, DataType::kBFloat16, r == 0 ? 2.f : 3.f); },
      "divided by 2 as bfloat16");
}

}  // namespace
}  // namespace braid
