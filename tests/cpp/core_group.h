// Test scaffolding shared by the core suites: a group of communicators with
// threads as ranks over an in-process store, and op descriptors.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "collectives/communicator.h"
#include "memory_store.h"
#include "transport/shm/window.h"

namespace braid {
namespace testing {

struct Group {
  MemoryStore store;
  std::vector<std::unique_ptr<collectives::Communicator>> comms;
  Group(int n, size_t slotBytes, size_t channelBytes = 4096,
        std::chrono::milliseconds timeout = std::chrono::seconds(20))
      : comms(n) {
    runRanks(n, [&](int r) {
      transport::shm::WindowOptions o;
      o.slotBytes = slotBytes;
      o.channelBytes = channelBytes;
      o.timeout = timeout;
      comms[r] = std::make_unique<collectives::Communicator>(
          transport::shm::ShmWindow::create(store, r, n, o));
    });
  }
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
