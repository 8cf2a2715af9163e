// Registered buffers: memory that every rank of a shared-memory group has
// mapped, so that an allreduce reads and writes its peers' buffers in place.
//
// Note [Registered buffers]
// An allreduce through slots moves each byte through shared memory: a rank
// copies its input into a slot, reduces from its peers' slots, then copies
// every reduced share out, several passes over the data on top of reading
// its input and writing its output. On a host whose cores all compute (DDP on
// CPUs, issue 31) the step is bound by memory bandwidth, and those passes are
// the cost of communication. A buffer every rank can map needs none of them:
// - registerBuffer is a collective: every rank brings a SharedRegion of the
//   same size (Note [Shared regions]); the header step compares the sizes,
//   the ranks exchange handles through their slots, each maps every peer's
//   region, and a second step agrees on the outcome: if any rank could not
//   map a peer's region (permissions) or has BRAID_SHARED_BUFFERS off, no rank
//   registers it (its memory still serves as ordinary memory) and the call
//   returns 0 on every rank. The id, counted per call, is the same on every
//   rank.
// - An allreduce of more than the one-shot threshold whose buffer (in == out)
//   lies inside a registered region takes the registered path (plan() in
//   plan.h): after the header step, which also carries the region's id and
//   the buffer's offset in it, rank r reduces slice r of the buffer from every
//   rank's buffer, in rank order (the bits of every other path), in place in
//   its own buffer, and then writes it into every peer's buffer, a
//   cache-sized piece at a time so that the copies read it from cache. Slices
//   are disjoint: rank r alone reads slice r of any buffer and then writes
//   it. A last step keeps every rank in the op until its peers have written
//   their slices into its buffer. Each rank reads its slice of n buffers and
//   writes it n times: the whole buffer read once and written once, the
//   least an in-place allreduce can move.
// - Ranks must agree: one rank's registered buffer against another's plain one
//   takes different paths, which the header step reports on every rank (the
//   path is compared like a setting, Note [Settings that shape an op]), and
//   buffers in different regions fail the op on every rank, naming both.
//   braid's reducer allocates its buckets this way on every rank alike.
// - Lifetime: a rank's own region lives as long as its tensor; its mappings
//   of the peers' regions go when it frees its own region with the same id
//   (ranks that free their buffers alike, as the reducer does when it
//   rebuilds its buckets, free everything), else when the group is
//   destroyed. A peer that maps a region keeps its pages alive: a rank that
//   frees or dies leaves no dangling mapping behind, and a memfd leaves no
//   name in /dev/shm.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "transport/shm/shared_region.h"

namespace braid {
namespace collectives {

class Communicator;
struct OpDesc;

class RegionTable {
 public:
  struct Ref {
    uint64_t id = 0;
    uint64_t offset = 0;  // bytes from the region's start
  };
  using Regions = std::vector<std::shared_ptr<transport::shm::SharedRegion>>;

  explicit RegionTable(int rank) : rank_(rank) {}
  // `all`: every rank's region with this id, this rank's own at [rank].
  void add(uint64_t id, Regions all);
  // Whether [p, p + bytes) lies inside one of this rank's live regions.
  bool find(const void* p, size_t bytes, Ref* out) const;
  // The regions registered as `id` (empty if released); the copies keep them
  // mapped while an op uses them.
  Regions get(uint64_t id) const;
  // Any thread (a tensor's deleter).
  void release(uint64_t id);
  void clear();
  // The id of the next registerBuffer call (the group's op thread only).
  uint64_t nextId() { return ++calls_; }

 private:
  const int rank_;
  mutable std::mutex mu_;
  std::map<uint64_t, Regions> live_;
  uint64_t calls_ = 0;
};

// Collective: see Note [Registered buffers]. op: kind kRegister, dtype uint8,
// count = mine->size(). Returns the region's id, 0 when the ranks did not
// register it.
uint64_t registerBuffer(Communicator& c, const OpDesc& op,
                        const std::shared_ptr<transport::shm::SharedRegion>& mine);

// Allreduce in place in `buf`, inside the region `ref` names.
void allreduceRegistered(Communicator& c, const OpDesc& op, void* buf,
                         const RegionTable::Ref& ref);

}  // namespace collectives
}  // namespace braid
