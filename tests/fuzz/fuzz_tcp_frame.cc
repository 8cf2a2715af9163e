// libFuzzer target for the TCP frame decoder (Note [TCP framing]): feeds an
// arbitrary byte stream through the checks a receiving socket applies, and
// traps when a promise of the decoder is broken. Built and run by
// tests/fuzz/run.sh with -fsanitize=fuzzer,address,undefined, so any read or
// write outside the simulated receive buffer is caught as well.
//
// Input: byte 0 picks the socket's peer rank (0..3); the rest is what that
// socket would deliver: headers, each followed by its payload.
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "transport/tcp/frame.h"

using namespace braid::transport::tcp;

namespace {

struct Message {
  uint64_t tag, total, received;
  std::vector<uint8_t> buf;  // the "posted receive", for messages up to 64 KiB
};

void check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  SocketOrder order(data[0] & 3);
  const uint8_t* p = data + 1;
  size_t n = size - 1;
  std::map<uint64_t, Message> msgs;
  for (;;) {
    FrameHeader h;
    std::string why;
    DecodeStatus st = decodeFrame(p, n, &h, &why);
    if (st == DecodeStatus::kNeedMore) break;
    if (st == DecodeStatus::kInvalid) {
      check(!why.empty());
      break;
    }
    uint8_t again[kFrameHeaderBytes];
    encodeFrame(h, again);
    check(std::memcmp(again, p, kFrameHeaderBytes) == 0);
    if (h.opcode == Opcode::kGoodbye) {  // a short reason, no message; the stream ends
      check(h.chunk <= kMaxGoodbyeBytes && !h.tag && !h.seq && !h.total && !h.offset);
      check(order.check(h, &why) == (h.source == (data[0] & 3u)));
      break;
    }
    check(h.opcode == Opcode::kData);
    // What decodeFrame promises.
    check(h.chunk <= kMaxChunkBytes && h.total <= kMaxMessageBytes);
    check(h.offset <= h.total && h.chunk <= h.total - h.offset);
    check(h.chunk > 0 || h.total == 0);
    p += kFrameHeaderBytes;
    n -= kFrameHeaderBytes;
    if (!order.check(h, &why)) {
      check(!why.empty());
      break;
    }
    Message& m = msgs.try_emplace(h.seq, Message{h.tag, h.total, 0, {}}).first->second;
    const uint64_t before = m.received;
    if (!checkMessage(h, m.tag, m.total, &m.received, &why)) {
      check(!why.empty() && m.received == before);
      break;
    }
    check(m.received == before + h.chunk && m.received <= m.total);
    size_t take = n < h.chunk ? n : h.chunk;
    if (m.total <= (64u << 10)) {
      m.buf.resize(m.total);
      if (take) std::memcpy(m.buf.data() + h.offset, p, take);  // ASan checks the bounds
    }
    p += take;
    n -= take;
    if (take < h.chunk) break;
  }
  return 0;
}
