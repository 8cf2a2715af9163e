// The fields every op header starts with, whatever carries it (the shared
// memory window's header step, or the network's header exchange), and the one
// comparison both use (Note [Op headers] in communicator.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "collectives/shm/communicator.h"

namespace braid {
namespace collectives {

constexpr size_t kOpMessageBytes = 256;

struct OpHeader {
  uint32_t magic;
  uint32_t kind;
  uint64_t opSeq;
  uint32_t dtype;
  uint32_t redop;
  int32_t root;
  int32_t failed;  // the rank failed its argument checks: `message` says why
  uint64_t count;
  Shape shape;
  // Note [Allreduce on a narrower wire]: 0, or 1 + the wire's DataType, and
  // the divisor its values were divided by.
  uint32_t wire;
  float wireDivisor;
  char message[kOpMessageBytes];
};

// Fills `h` from `op`, this rank's op number `seq`; a failed op carries
// op.localError (cut to fit).
void fillOpHeader(OpHeader* h, uint32_t magic, const OpDesc& op, uint64_t seq);

// Throws an Error naming `op`, `rank` and both values at the first field in
// which `theirs` (rank `peer`'s) differs from `mine`: the magic, the peer's
// own failure, then the op's kind, number, dtype/count/shape, wire type, root
// and reduce op. The settings that shape an op are each transport's to compare.
void checkOpHeader(const char* op, int rank, int peer, const OpHeader& theirs,
                   const OpHeader& mine);

// Throws the Error for a setting that shapes an op (Note [Settings that
// shape an op]) and that rank `peer` runs with another value than this rank.
[[noreturn]] void settingDiffers(const char* op, int rank, int peer, const char* setting,
                                 const std::string& theirs, const std::string& ours);

}  // namespace collectives
}  // namespace braid
