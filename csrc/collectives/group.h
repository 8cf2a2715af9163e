// A group's collectives and point-to-point messages, whatever carries them:
// the backend runs every op through this interface and never learns which
// transport a group uses. makeGroup (collectives/make_group.cc) is the one
// place that chooses (Note [Choosing a group's transport]).
//
// Implementations:
//  - ShmGroup (shm/shm_group.cc): every rank on one host; the slot-based
//    algorithms over the shared-memory Window (shm/collectives.h).
//  - HierGroup (hier/hier_group.h): ranks on several hosts; TCP between them,
//    shared memory within each (Note [Collectives across hosts]).
//
// Threading: the collectives run one at a time on the thread that runs the
// group's jobs (the backend's worker, or a waiting caller); p2p() and abort()
// may be used from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include "collectives/shm/communicator.h"
#include "transport/p2p.h"

namespace braid {
namespace collectives {

// The send/recv interface lives with the transports (transport/p2p.h), since
// the shared-memory one (transport/shm/p2p_engine.h) implements it there.
using PointToPoint = transport::PointToPoint;

class Group {
 public:
  virtual ~Group() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "shared memory" or "2 hosts over TCP: ...", for logs.
  virtual std::string describe() const = 0;

  // The collectives of collectives.h, with their contracts.
  virtual void allreduce(const OpDesc& op, const void* in, void* out) = 0;
  virtual void broadcast(const OpDesc& op, void* buf) = 0;
  virtual void reduce(const OpDesc& op, const void* in, void* out) = 0;
  virtual void allgather(const OpDesc& op, const void* in, void* const* outs) = 0;
  virtual void gather(const OpDesc& op, const void* in, void* const* outs) = 0;
  virtual void scatter(const OpDesc& op, const void* const* ins, void* out) = 0;
  virtual void reduceScatter(const OpDesc& op, const void* const* ins, void* out) = 0;
  virtual void alltoall(const OpDesc& op, const void* const* ins, void* const* outs) = 0;
  virtual void barrier(const OpDesc& op) = 0;
  // Whether allreduce takes ops with op.narrowed() (Note [Allreduce on a
  // narrower wire] in shm/collectives.h); the same on every rank of a group.
  virtual bool narrowsOnWire() const { return false; }
  // A rank that failed op's argument checks tells its peers (Note [Op headers]).
  virtual void failOp(const OpDesc& op) = 0;
  // The header step of `op` alone: every rank's header is compared with this
  // one's, and a mismatch throws the Error that op itself would have thrown.
  // For ops whose data moves elsewhere (Note [The NCCL path in the backend]).
  // Every transport's barrier is exactly that step.
  void checkOp(const OpDesc& op) { barrier(op); }

  // Note [Registered buffers] (shm/registered.h): collective; every rank
  // brings a region of the same size. Returns its id, 0 on every rank where
  // it was not registered (transports without registered buffers: always).
  virtual uint64_t registerBuffer(const OpDesc& op,
                                  const std::shared_ptr<transport::shm::SharedRegion>& region) {
    (void)op;
    (void)region;
    return 0;
  }
  // After an op whose desc had offersBuffer set: whether every rank's had
  // (Note [Adopting a repeated buffer] in c10d/buffer_adoption.h); the
  // same on every rank. Transports without registered buffers: never.
  virtual bool everyRankOffered() const { return false; }
  // Where registered regions are released (any thread); nullptr without them.
  virtual std::shared_ptr<RegionTable> regionTable() { return nullptr; }
  // After an error that leaves ranks out of step: later ops fail at once.
  virtual void markBroken(const std::string& why) = 0;

  // Started on first use; lives as long as the group.
  virtual PointToPoint& p2p() = 0;
  // Wakes every wait (a job stuck on a peer returns). Any thread.
  virtual void abort() = 0;
  // After the last op: releases the transports (no waits run any more).
  virtual void close() = 0;
};

}  // namespace collectives
}  // namespace braid
