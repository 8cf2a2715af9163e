// A single-producer single-consumer byte ring in shared memory.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <utility>

#include "transport/shm/futex.h"
#include "transport/window.h"

namespace braid {
namespace transport {
namespace shm {

// Note [Waking a writer only when it waits]
// A write wakes the reader's engine (it has bytes to take). A read used to
// wake the writer's engine too, in case it waited for room: for a small
// message it never does, and that wake-up cost the writer's host a context
// switch per message for nothing. Now a writer that finds too little room
// raises `writerWaits` and then looks at `tail` again; a reader advances
// `tail` and then wakes the writer only if the flag was up. All four
// accesses are sequentially consistent, so either the writer sees the room
// made or the reader sees the flag: no wake-up is lost.
struct alignas(64) RingHeader {
  std::atomic<uint64_t> head{0};  // bytes ever written; owned by the writer
  char pad0[56];
  std::atomic<uint64_t> tail{0};  // bytes ever read; owned by the reader
  std::atomic<uint32_t> writerWaits{0};
  char pad1[52];
};

class RingChannel : public ByteChannel {
 public:
  // `wakeOther` is the activity counter of the rank at the other end.
  // `reserve` (the writer's end only) runs before the first write and throws
  // when the ring's memory cannot be had (Note [Reserved shared memory]).
  RingChannel(RingHeader* h, uint8_t* buf, size_t cap, Counter* wakeOther,
              std::function<void()> reserve = {})
      : h_(h), buf_(buf), cap_(cap), wakeOther_(wakeOther), reserve_(std::move(reserve)) {}

  size_t write(const void* src, size_t n) override {
    n = writeQuiet(src, n);
    if (n) wakeReader();
    return n;
  }

  void wakeReader() override { wakeOther_->poke(); }

  size_t writeQuiet(const void* src, size_t n) override {
    if (reserve_ && !reserved_.load(std::memory_order_acquire)) {
      reserve_();
      reserved_.store(true, std::memory_order_release);
    }
    uint64_t head = h_->head.load(std::memory_order_relaxed);
    uint64_t tail = h_->tail.load(std::memory_order_acquire);
    if (cap_ - (head - tail) < n) {  // Note [Waking a writer only when it waits]
      h_->writerWaits.store(1, std::memory_order_seq_cst);
      tail = h_->tail.load(std::memory_order_seq_cst);
    }
    n = std::min<size_t>(n, cap_ - (head - tail));
    if (n == 0) return 0;
    copyRing(buf_, head % cap_, static_cast<const uint8_t*>(src), n, true);
    h_->head.store(head + n, std::memory_order_release);
    return n;
  }

  size_t read(void* dst, size_t n) override {
    uint64_t tail = h_->tail.load(std::memory_order_relaxed);
    uint64_t head = h_->head.load(std::memory_order_acquire);
    n = std::min<size_t>(n, head - tail);
    if (n == 0) return 0;
    copyRing(buf_, tail % cap_, static_cast<uint8_t*>(dst), n, false);
    h_->tail.store(tail + n, std::memory_order_seq_cst);
    if (h_->writerWaits.load(std::memory_order_seq_cst) &&
        h_->writerWaits.exchange(0, std::memory_order_seq_cst)) {
      wakeOther_->poke();
    }
    return n;
  }

  size_t readable() const override {
    return h_->head.load(std::memory_order_acquire) - h_->tail.load(std::memory_order_relaxed);
  }
  size_t capacity() const override { return cap_; }

 private:
  void copyRing(uint8_t* ring, size_t off, uint8_t* user, size_t n, bool intoRing) {
    size_t first = std::min(n, cap_ - off);
    if (intoRing) {
      std::memcpy(ring + off, user, first);
      std::memcpy(ring, user + first, n - first);
    } else {
      std::memcpy(user, ring + off, first);
      std::memcpy(user + first, ring, n - first);
    }
  }
  void copyRing(uint8_t* ring, size_t off, const uint8_t* user, size_t n, bool intoRing) {
    copyRing(ring, off, const_cast<uint8_t*>(user), n, intoRing);
  }

  RingHeader* h_;
  uint8_t* buf_;
  size_t cap_;
  Counter* wakeOther_;
  std::function<void()> reserve_;
  std::atomic<bool> reserved_{false};
};

}  // namespace shm
}  // namespace transport
}  // namespace braid
