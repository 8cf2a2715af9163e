#include <algorithm>
#include <cstring>

#include "collectives/net/collectives.h"
#include "collectives/net/ring.h"
#include "common/error.h"

namespace braid {
namespace collectives {
namespace net {

namespace {

int ceilLog2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

}  // namespace

// Note [Broadcast across hosts]
// A binomial tree takes log2(n) latencies and each rank receives the buffer
// once, but the root sends it ceil(log2 n) times, one after another on its
// link: 2S at 3 or 4 ranks, 3S at 8. A pipelined chain (root -> root+1 ->
// ... in segments of kSegmentBytes, each forwarded as soon as it is in)
// sends every byte across each link once, so S plus the time for the first
// segment to reach the last rank, (n - 2) segments more. The chain is taken
// when that is less: S (ceil(log2 n) - 1) > (n - 2) segments, which every
// rank decides alike from n and the op's size (both in the checked header):
// from 1 MiB at 3 ranks, 2 MiB at 4, 3 MiB at 8. Two ranks are one send
// either way. On links of their own (3 hosts x 1 rank, veth capped at
// 1 Gbit/s, alternating runs): 64 MiB in 588-602 ms against the tree's
// 1125 ms (gloo 1119-1135 ms; the link's bound is 537 ms), 4 MiB in 37-39 ms
// against 70 (benchmarks/results/hosts-broadcast.txt). Where the three
// "hosts" share this VM's two cores, the kernel's copies and not the links
// set the pace, and the chain's hand-offs show: 16 and 64 MiB take 24% longer
// than the tree's (medians 14.5 and 48.9 ms against 11.7 and 39.8; gloo 15.9
// and 50.3), 2 and 4 MiB the same. Real links are the slower part, so the
// chain it is.
bool chainBroadcast(int n, uint64_t bytes) {
  return n >= 3 && bytes * (ceilLog2(n) - 1) > uint64_t(n - 2) * kSegmentBytes;
}

// Root -> root + 1 -> ... -> root + n - 1, segment by segment.
void broadcastChain(NetComm& c, const OpDesc& op, void* buf) {
  c.begin(op, NetAlgo::kChain);
  const int n = c.size(), v = (c.rank() - op.root + n) % n;
  const int prev = (c.rank() + n - 1) % n, next = (c.rank() + 1) % n;
  auto* b = static_cast<uint8_t*>(buf);
  const size_t bytes = op.bytes();
  const size_t first = c.posted();
  if (v > 0) {
    for (size_t off = 0; off < bytes; off += kSegmentBytes) {
      c.recv(prev, 1, b + off, std::min(kSegmentBytes, bytes - off));
    }
  }
  size_t k = first;
  for (size_t off = 0; off < bytes; off += kSegmentBytes, ++k) {
    if (v > 0) c.waitPosted(k);
    if (v < n - 1) c.send(next, 1, b + off, std::min(kSegmentBytes, bytes - off));
  }
  c.wait();
}

// Binomial tree over ranks relative to the root, or from a few segments a
// chain (Note [Broadcast across hosts]).
// A buffer that fits a header's inline area rides in the root's header to
// every rank at once (Note [Eager data]): one latency whatever n.
void broadcast(NetComm& c, const OpDesc& op, void* buf) {
  auto drive = c.drive(op);
  const size_t bytes = op.bytes();
  if (chainBroadcast(c.size(), bytes)) return broadcastChain(c, op, buf);
  if (c.fitsInline(op)) {
    c.beginEager(op, NetAlgo::kDirect, c.rank() == op.root ? buf : nullptr);
    if (c.rank() != op.root && bytes) {
      const uint8_t* data = c.inlineData(op.root);  // the check passed: the root sent it
      BRAID_ENFORCE(data, "broadcast", c.rank(), "root ", op.root, " sent no data inline");
      std::memcpy(buf, data, bytes);
    }
    return;
  }
  c.begin(op, NetAlgo::kTree);
  const int n = c.size();
  const int v = (c.rank() - op.root + n) % n;
  int mask = 1;
  while (mask < n) {
    if (v & mask) {
      c.recv((v - mask + op.root) % n, 1, buf, bytes);
      c.wait();
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask < n) c.send((v + mask + op.root) % n, 1, buf, bytes);
  }
  c.wait();
}

}  // namespace net
}  // namespace collectives
}  // namespace braid
