// The TCP transport's data frames: a fixed header, then the chunk's bytes.
// Decoding and checking are pure functions over bytes, so that a fuzzer
// (tests/fuzz/fuzz_tcp_frame.cc) can drive them without sockets.
//
// Note [TCP framing]
// Every socket of a peer pair carries a stream of frames, each a 48-byte
// little-endian header followed by `chunk` payload bytes:
//
//   off size field
//     0    4 magic    "BRTF" (0x46545242)
//     4    1 version  1
//     5    1 opcode   1 = data, 2 = goodbye; anything else closes the connection
//     6    2 flags    0 (non-zero is rejected: no silent extensions)
//     8    4 source   the sender's rank (must be the socket's peer)
//    12    4 chunk    payload bytes in this frame, <= kMaxChunkBytes
//    16    8 tag      the message's tag
//    24    8 seq      the message's number from this sender to this receiver
//    32    8 total    the message's size, <= kMaxMessageBytes
//    40    8 offset   where the chunk goes in the message
//
// A message is cut into chunks of at least 64 KiB (BRAID_TCP_CHUNK_BYTES);
// whichever socket of the pair is free takes the next chunk, so a large
// message streams over all sockets at once, and the receiver puts each chunk
// at its offset. The sender hands out chunks in (seq, offset) order, so on one
// socket (seq, offset) strictly increases: a frame that goes back is
// "out of order" and closes the pair. Checks, all without overflow:
// - decodeFrame: magic, version, opcode, flags; chunk <= kMaxChunkBytes;
//   total <= kMaxMessageBytes; offset <= total and chunk <= total - offset;
//   chunk > 0 unless total == 0 (which has the one frame at offset 0);
// - SocketOrder::check: source is the peer; (seq, offset) moves forward;
// - checkMessage: every frame of a message repeats its tag and total, and
//   the bytes received never exceed the total;
// - the receiver fails a receive whose size differs from the message's total
//   (both named) and discards that message's bytes; the pair stays usable.
// Receives are matched per source in seq order (Note [TCP matching and
// buffering], tcp/pair.h).
// Goodbye (Note [Saying why on the way out]): a rank whose transport is
// aborted (its op failed, or its group is shut down) writes, on every socket
// that is between frames, one goodbye frame whose payload is the reason
// (chunk <= kMaxGoodbyeBytes; tag, seq, total and offset 0), then closes. The
// receiver fails the pair with that reason, so a rank that learns of a lost
// host second hand, from a rank that left because of it, still names it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace braid {
namespace transport {
namespace tcp {

constexpr uint32_t kFrameMagic = 0x46545242;  // "BRTF" little-endian
constexpr uint8_t kFrameVersion = 1;
constexpr size_t kFrameHeaderBytes = 48;
constexpr uint32_t kMaxChunkBytes = 1u << 30;
constexpr uint64_t kMaxMessageBytes = uint64_t(1) << 48;

enum class Opcode : uint8_t { kData = 1, kGoodbye = 2 };
constexpr uint32_t kMaxGoodbyeBytes = 1024;

struct FrameHeader {
  uint8_t version = kFrameVersion;
  Opcode opcode = Opcode::kData;
  uint16_t flags = 0;
  uint32_t source = 0;
  uint32_t chunk = 0;
  uint64_t tag = 0;
  uint64_t seq = 0;
  uint64_t total = 0;
  uint64_t offset = 0;
};

enum class DecodeStatus { kOk, kNeedMore, kInvalid };

// Writes the header's kFrameHeaderBytes bytes (magic included) to `out`.
void encodeFrame(const FrameHeader& h, uint8_t* out);

// Decodes and checks a header from the first `n` bytes of `p`. kNeedMore
// when n < kFrameHeaderBytes; kInvalid with `why` set when a check fails.
DecodeStatus decodeFrame(const uint8_t* p, size_t n, FrameHeader* h, std::string* why);

// The order check of one socket (see the Note).
class SocketOrder {
 public:
  explicit SocketOrder(uint32_t peer) : peer_(peer) {}
  bool check(const FrameHeader& h, std::string* why);

 private:
  uint32_t peer_;
  bool any_ = false;
  uint64_t seq_ = 0;
  uint64_t end_ = 0;  // offset + chunk of the last frame
};

// A frame against the message it belongs to: the tag and total recorded from
// its first frame and the bytes received so far. On success adds the chunk.
bool checkMessage(const FrameHeader& h, uint64_t tag, uint64_t total, uint64_t* received,
                  std::string* why);

}  // namespace tcp
}  // namespace transport
}  // namespace braid
