// Test scaffolding shared by the core suites: a group of communicators with
// threads as ranks over an in-process store, and op descriptors.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "collectives/shm/communicator.h"
#include "memory_store.h"
#include "transport/shm/window.h"

namespace braid {
namespace testing {

// How a Group is made. config gives each rank's settings (what the
// environment would give, per rank without setenv; see Note [Settings that
// shape an op]); empty: read from the environment as the backend does.
struct GroupOptions {
  size_t slotBytes = 4096;
  size_t channelBytes = 4096;
  std::chrono::milliseconds timeout = std::chrono::seconds(20);
  std::function<collectives::CollectiveConfig(int rank)> config;
  int useCma = -1;  // -1: BRAID_SHM_CMA
};

inline GroupOptions slots(size_t slotBytes) {
  GroupOptions o;
  o.slotBytes = slotBytes;
  return o;
}

// Every op with a direct path reads peers' memory at any size, allreduce too
// (no one-shot), where the OS permits direct reads (Note [Direct transfers]).
inline collectives::CollectiveConfig directEverywhere() {
  collectives::CollectiveConfig c;
  c.directMinBytes = 0;
  c.allreduceOneShotMax = 0;
  c.directOps = collectives::parseDirectOps(
      "allreduce,broadcast,allgather,gather,scatter,reduce_scatter,alltoall", 0);
  return c;
}

inline GroupOptions withConfig(GroupOptions o, const collectives::CollectiveConfig& c) {
  o.config = [c](int) { return c; };
  return o;
}

// Shared memory only: direct reads off on every rank.
inline GroupOptions shmOnly(GroupOptions o) {
  o.useCma = 0;
  return o;
}

struct Group {
  MemoryStore store;
  std::vector<std::unique_ptr<collectives::Communicator>> comms;
  Group(int n, const GroupOptions& opts) : comms(n) {
    runRanks(n, [&](int r) {
      transport::shm::WindowOptions o;
      o.controlBytes = collectives::Communicator::controlBytesFor(n);
      o.slotBytes = opts.slotBytes;
      o.channelBytes = opts.channelBytes;
      o.timeout = opts.timeout;
      o.useCma = opts.useCma;
      auto w = transport::shm::ShmWindow::create(store, r, n, o);
      std::optional<collectives::CollectiveConfig> cfg;
      if (opts.config) cfg = opts.config(r);
      comms[r] = std::make_unique<collectives::Communicator>(std::move(w), cfg);
    });
  }
  Group(int n, size_t slotBytes, size_t channelBytes = 4096,
        std::chrono::milliseconds timeout = std::chrono::seconds(20))
      : Group(n, [&] {
          GroupOptions o = slots(slotBytes);
          o.channelBytes = channelBytes;
          o.timeout = timeout;
          return o;
        }()) {}
};

// A 1-D op of `count` elements whose deadline starts now.
inline collectives::OpDesc desc(collectives::OpKind k, size_t count,
                                DataType t = DataType::kFloat32, int root = 0,
                                ReduceOp op = ReduceOp::kSum,
                                std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  collectives::OpDesc d;
  d.kind = k;
  d.dtype = t;
  d.count = count;
  d.root = root;
  d.redop = op;
  d.shape.ndim = 1;
  d.shape.dims[0] = static_cast<int64_t>(count);
  d.timeout = timeout;
  d.deadline = transport::Clock::now() + timeout;
  return d;
}

}  // namespace testing
}  // namespace braid
