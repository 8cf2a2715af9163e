// What shapes an op's steps: the group's CollectiveConfig (read once, when the
// group is created) and plan(), the one place that picks an op's algorithm.
//
// Note [Settings that shape an op]
// Some settings decide which steps an op takes: the one-shot thresholds, the
// direct-read choice, the chunk size, the slot size. Ranks that disagree on
// one would follow different step sequences and reduce slots their peers
// filled only partly: a wrong result without an error (issue 8). So:
// - they are read once per group, into a CollectiveConfig, never per op (a
//   process that sweeps them makes a new group for each value);
// - plan() alone turns (op, bytes, config) into an algorithm;
// - every op header carries the algorithm actually taken and the values of
//   the settings that chose it or that its steps depend on, and
//   Communicator::checkPeer compares them like the shape (Note [Op headers]),
//   so every rank fails the op, naming the setting and both values, before
//   any data moves, and the group stays usable. Compared are the op kind's
//   own one-shot threshold, for allreduce and barrier the tree's
//   BRAID_ALLREDUCE_TREE_RANKS (and for allreduce its _MAX_BYTES; Note [Tree
//   allreduce] in tree.h), whether BRAID_DIRECT_OPS names the kind,
//   BRAID_DIRECT_MIN_BYTES where it does, then the path, then the chunk size
//   where the path's steps depend on it: a threshold is compared even where
//   both values pick the same path for this op's size, so a mismatch fails
//   the first op of its kind rather than a later, larger one; while ranks
//   that differ only in, say, BRAID_REDUCE_ONESHOT_MAX still run allreduce;
// - what fixes the window's layout (BRAID_SHM_SLOT_BYTES, BRAID_SHM_P2P_BYTES)
//   is compared once, when the window is created, and a difference fails the
//   group's creation on every rank; BRAID_SHM_CMA only lowers what the group
//   can do, and the ranks agree on the result (direct reads only where every
//   rank may read every other's memory).
// BRAID_HOST_ID_OVERRIDE is exchanged when the group is created anyway (Note
// [Group topology]). Settings that change only timing need not agree:
// spin times, timeouts, logging, and the kernels' SIMD level (every level
// gives the scalar kernels' bits, as test_core_reduce.cc checks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace braid {
namespace collectives {

enum class OpKind : uint32_t {
  kAllreduce = 1,
  kBroadcast,
  kReduce,
  kAllgather,
  kGather,
  kScatter,
  kReduceScatter,
  kAlltoall,
  kBarrier,
  kRegister,  // Note [Registered buffers] (registered.h): a collective of its own
};
const char* opName(OpKind k);

inline uint32_t opBit(OpKind k) { return 1u << static_cast<uint32_t>(k); }

// One group's settings that shape its ops' steps. Defaults as documented
// with each BRAID_ setting (plan.cc); tests set fields per rank directly.
struct CollectiveConfig {
  uint64_t allreduceOneShotMax = 64 << 10;  // BRAID_ALLREDUCE_ONESHOT_MAX
  uint64_t reduceOneShotMax = 64 << 10;     // BRAID_REDUCE_ONESHOT_MAX
  uint64_t directMinBytes = 256 << 10;      // BRAID_DIRECT_MIN_BYTES
  uint32_t directOps = opBit(OpKind::kAllgather) | opBit(OpKind::kGather) |
                       opBit(OpKind::kScatter) | opBit(OpKind::kReduceScatter) |
                       opBit(OpKind::kAlltoall);  // BRAID_DIRECT_OPS
  uint64_t chunkBytes = 0;  // BRAID_CHUNK_BYTES; 0: chosen from cores and slot size
  // Note [Tree allreduce] (tree.h): groups of at least treeRanks ranks (0:
  // none) gather small allreduces and barriers up a radix-4 tree.
  uint64_t treeRanks = 8;              // BRAID_ALLREDUCE_TREE_RANKS
  uint64_t treeMaxBytes = 16 << 10;    // BRAID_ALLREDUCE_TREE_MAX_BYTES

  // The BRAID_ environment variables, defaults where unset. Throws an Error
  // naming "init", `rank` and the setting when a value is invalid.
  static CollectiveConfig fromEnv(int rank);
  // Throws as fromEnv does when a value is invalid.
  void check(int rank) const;
};

// BRAID_DIRECT_OPS's comma list to a mask of opBit()s ("none": no op); an
// unknown name is an Error naming the known ones.
uint32_t parseDirectOps(const std::string& list, int rank);
// The mask as that list, in OpKind order ("none" when empty).
std::string directOpsList(uint32_t mask);

// What the group's window offers; fixed when the group is created and equal
// on every rank (Note [Settings that shape an op]).
struct GroupLimits {
  size_t slotBytes = 0;
  bool canReadPeers = false;
  // The group's ranks where its window offers the bytes beside each step
  // counter (Window::lineBytes) that the tree needs; 0 (no tree) otherwise.
  int treeRanks = 0;
};

// How an op moves its data. Values travel in op headers.
enum class Algo : uint32_t {
  kHeaderOnly = 1,  // barrier, or a rank that failed its argument checks
  kOneShot,         // allreduce, reduce: one step, every input whole in a slot
  kShm,             // pipelined through shared-memory slots in chunks
  kDirect,          // peers' buffers read directly (Note [Direct transfers])
  kBySizes,         // alltoall: kShm or kDirect, from the sizes in the headers
  kRegistered,      // allreduce in registered buffers (Note [Registered buffers])
  kNarrowed,        // allreduce on a 16-bit wire (Note [Allreduce on a narrower wire])
  kTree,            // allreduce, barrier: gather up a radix-4 tree, flat release (Note [Tree allreduce])
};
const char* algoName(Algo a);

// The algorithm for `kind` with `bytes` per rank (alltoall: the largest block
// any rank sends to one peer). Monotone in bytes for direct reads: if it picks
// kDirect for b bytes it does for more. `registered`: the op's buffer lies in
// a registered region (Note [Registered buffers]).
Algo plan(OpKind kind, size_t bytes, const CollectiveConfig& cfg, const GroupLimits& g,
          bool registered = false);

// The one-shot threshold setting of `kind` (nullptr: none) and its value.
const char* oneShotSetting(OpKind kind);
uint64_t oneShotMax(OpKind kind, const CollectiveConfig& cfg);
// Whether `kind` may take the tree (Note [Tree allreduce]), so that its
// settings matter to it.
bool hasTreePath(OpKind kind);
// Whether `kind` has a direct path, so that BRAID_DIRECT_OPS matters to it.
bool hasDirectPath(OpKind kind);
// Whether the steps of `kind` run as `a` depend on the chunk size.
bool stepsUseChunks(OpKind kind, Algo a);

}  // namespace collectives
}  // namespace braid
