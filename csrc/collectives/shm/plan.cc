#include "collectives/shm/plan.h"

#include <sstream>

#include "common/error.h"
#include "common/settings.h"

namespace braid {
namespace collectives {

// Read by CollectiveConfig::fromEnv once per group; see Note [Settings that
// shape an op] and, for the direct and chunk defaults, Note [Chunk size and
// direct reads] in communicator.cc.
BRAID_SETTING_INT(kAllreduceOneShotMax, "BRAID_ALLREDUCE_ONESHOT_MAX", 64 << 10,
                  "Largest allreduce (bytes) done in one step, each rank reducing all inputs; "
                  "larger ones use reduce-scatter + allgather. Must be equal on every rank.");
BRAID_SETTING_INT(kReduceOneShotMax, "BRAID_REDUCE_ONESHOT_MAX", 64 << 10,
                  "Largest reduce (bytes) that the root combines alone in one step; larger "
                  "ones share the work as reduce-scatter + gather. Must be equal on every rank.");
BRAID_SETTING_INT(kDirectMin, "BRAID_DIRECT_MIN_BYTES", 256 << 10,
                  "Smallest op (bytes per rank; alltoall: the largest block one rank sends to "
                  "another) that reads peers' memory directly instead of copying through shared "
                  "memory; needs direct reads (BRAID_SHM_CMA). Must be equal on every rank.");
BRAID_SETTING_STRING(kDirectOps, "BRAID_DIRECT_OPS",
                     "allgather,gather,scatter,reduce_scatter,alltoall",
                     "Ops that may read peers' memory directly (comma list of allreduce, "
                     "broadcast, allgather, gather, scatter, reduce_scatter, alltoall, or none; "
                     "reduce is accepted but has no direct path). Must be equal on every rank.");
BRAID_SETTING_INT(kChunkBytes, "BRAID_CHUNK_BYTES", 0,
                  "Chunk size (bytes) of pipelined collectives, at most BRAID_SHM_SLOT_BYTES; "
                  "0 = 256 KiB when every rank has a core, else the slot size. Must be equal "
                  "on every rank.");

// Note [Tree allreduce] in tree.h; the defaults are discussed there.
BRAID_SETTING_INT(kTreeRanks, "BRAID_ALLREDUCE_TREE_RANKS", 8,
                  "Groups of at least this many ranks on a host run allreduces of up to "
                  "BRAID_ALLREDUCE_TREE_MAX_BYTES, and barriers, as a radix-4 gather tree with a "
                  "flat release instead of every rank reading every input; 0 = never. Must be "
                  "equal on every rank.");
BRAID_SETTING_INT(kTreeMaxBytes, "BRAID_ALLREDUCE_TREE_MAX_BYTES", 16 << 10,
                  "Largest allreduce (bytes) that takes the tree (BRAID_ALLREDUCE_TREE_RANKS); "
                  "also bounded by BRAID_ALLREDUCE_ONESHOT_MAX and half the slot size. Must be "
                  "equal on every rank.");

namespace {

constexpr OpKind kFirstKind = OpKind::kAllreduce;
constexpr OpKind kLastDirectKind = OpKind::kAlltoall;  // the kinds BRAID_DIRECT_OPS may name

uint64_t nonNegative(const IntSetting& s, int rank) {
  int64_t v = s.get();
  BRAID_ENFORCE(v >= 0, "init", rank, s.name(), " must be >= 0, got ", v);
  return static_cast<uint64_t>(v);
}

}  // namespace

const char* opName(OpKind k) {
  switch (k) {
    case OpKind::kAllreduce: return "allreduce";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kReduce: return "reduce";
    case OpKind::kAllgather: return "allgather";
    case OpKind::kGather: return "gather";
    case OpKind::kScatter: return "scatter";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kAlltoall: return "alltoall";
    case OpKind::kBarrier: return "barrier";
    case OpKind::kRegister: return "register_buffer";
  }
  return "unknown op";
}

CollectiveConfig CollectiveConfig::fromEnv(int rank) {
  CollectiveConfig c;
  c.allreduceOneShotMax = nonNegative(kAllreduceOneShotMax, rank);
  c.reduceOneShotMax = nonNegative(kReduceOneShotMax, rank);
  c.directMinBytes = nonNegative(kDirectMin, rank);
  c.directOps = parseDirectOps(kDirectOps.get(), rank);
  c.chunkBytes = nonNegative(kChunkBytes, rank);
  c.treeRanks = nonNegative(kTreeRanks, rank);
  c.treeMaxBytes = nonNegative(kTreeMaxBytes, rank);
  c.check(rank);
  return c;
}

void CollectiveConfig::check(int rank) const {
  BRAID_ENFORCE(chunkBytes % 64 == 0, "init", rank,
                "BRAID_CHUNK_BYTES must be 0 or a positive multiple of 64, got ", chunkBytes);
  uint32_t known = 0;
  for (auto k = static_cast<uint32_t>(kFirstKind); k <= static_cast<uint32_t>(kLastDirectKind); ++k)
    known |= opBit(static_cast<OpKind>(k));
  BRAID_ENFORCE((directOps & ~known) == 0, "init", rank, "BRAID_DIRECT_OPS mask ", directOps,
                " has bits that name no op");
}

uint32_t parseDirectOps(const std::string& list, int rank) {
  uint32_t mask = 0;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty() || item == "none") continue;
    bool found = false;
    std::string known;
    for (auto k = static_cast<uint32_t>(kFirstKind); k <= static_cast<uint32_t>(kLastDirectKind);
         ++k) {
      const char* name = opName(static_cast<OpKind>(k));
      known += known.empty() ? name : std::string(", ") + name;
      if (item == name) {
        mask |= 1u << k;
        found = true;
      }
    }
    BRAID_ENFORCE(found, "init", rank, "BRAID_DIRECT_OPS names an unknown op '", item,
                  "' (known: ", known, ", or none)");
  }
  return mask;
}

std::string directOpsList(uint32_t mask) {
  std::string out;
  for (auto k = static_cast<uint32_t>(kFirstKind); k <= static_cast<uint32_t>(kLastDirectKind); ++k) {
    if (mask & (1u << k)) out += (out.empty() ? "" : ",") + std::string(opName(static_cast<OpKind>(k)));
  }
  return out.empty() ? "none" : out;
}

const char* algoName(Algo a) {
  switch (a) {
    case Algo::kHeaderOnly: return "header-only";
    case Algo::kOneShot: return "one-shot";
    case Algo::kShm: return "pipelined shared-memory";
    case Algo::kDirect: return "direct-read";
    case Algo::kBySizes: return "size-chosen";
    case Algo::kRegistered: return "registered-buffer";
    case Algo::kNarrowed: return "narrowed-wire";
    case Algo::kTree: return "tree";
  }
  return "unknown algorithm";
}

const char* oneShotSetting(OpKind kind) {
  switch (kind) {
    case OpKind::kAllreduce: return "BRAID_ALLREDUCE_ONESHOT_MAX";
    case OpKind::kReduce: return "BRAID_REDUCE_ONESHOT_MAX";
    default: return nullptr;
  }
}

uint64_t oneShotMax(OpKind kind, const CollectiveConfig& cfg) {
  switch (kind) {
    case OpKind::kAllreduce: return cfg.allreduceOneShotMax;
    case OpKind::kReduce: return cfg.reduceOneShotMax;
    default: return 0;
  }
}

bool hasTreePath(OpKind kind) { return kind == OpKind::kAllreduce || kind == OpKind::kBarrier; }

bool hasDirectPath(OpKind kind) {
  return kind != OpKind::kReduce && kind != OpKind::kBarrier && kind != OpKind::kRegister;
}

bool stepsUseChunks(OpKind kind, Algo a) {
  switch (a) {
    case Algo::kShm:
    case Algo::kNarrowed:
    case Algo::kBySizes:  // the first step already holds the shm path's first pieces
      return true;
    case Algo::kDirect:  // the others read whole blocks in one step
      return kind == OpKind::kAllreduce;
    default:
      return false;
  }
}

Algo plan(OpKind kind, size_t bytes, const CollectiveConfig& cfg, const GroupLimits& g,
          bool registered) {
  // Note [Tree allreduce]: g.treeRanks is 0 where the window cannot.
  const bool treeGroup = cfg.treeRanks > 0 && g.treeRanks > 0 &&
                         static_cast<uint64_t>(g.treeRanks) >= cfg.treeRanks;
  if (kind == OpKind::kBarrier) return treeGroup ? Algo::kTree : Algo::kHeaderOnly;
  if (kind == OpKind::kRegister) return Algo::kHeaderOnly;
  // Up to its threshold a reducing op never reads directly: one step beats a
  // header step, the reads and two more steps.
  if (oneShotSetting(kind) && bytes <= oneShotMax(kind, cfg)) {
    // Partials of 16-bit types travel as float32: twice the bytes in a slot.
    if (kind == OpKind::kAllreduce && treeGroup && bytes <= cfg.treeMaxBytes &&
        2 * bytes <= g.slotBytes) {
      return Algo::kTree;
    }
    return bytes <= g.slotBytes ? Algo::kOneShot : Algo::kShm;
  }
  if (registered && kind == OpKind::kAllreduce) return Algo::kRegistered;
  if (hasDirectPath(kind) && g.canReadPeers && (cfg.directOps & opBit(kind)) &&
      bytes >= cfg.directMinBytes) {
    return Algo::kDirect;
  }
  return Algo::kShm;
}

}  // namespace collectives
}  // namespace braid
