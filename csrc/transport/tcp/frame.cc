#include "transport/tcp/frame.h"

#include <sstream>

namespace braid {
namespace transport {
namespace tcp {
namespace {

template <typename T>
void put(uint8_t* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

template <typename T>
T get(const uint8_t* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(p[i]) << (8 * i);
  return v;
}

bool fail(std::string* why, const std::string& s) {
  if (why) *why = s;
  return false;
}

std::string hex(uint64_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

}  // namespace

void encodeFrame(const FrameHeader& h, uint8_t* out) {
  put<uint32_t>(out, kFrameMagic);
  out[4] = h.version;
  out[5] = static_cast<uint8_t>(h.opcode);
  put<uint16_t>(out + 6, h.flags);
  put<uint32_t>(out + 8, h.source);
  put<uint32_t>(out + 12, h.chunk);
  put<uint64_t>(out + 16, h.tag);
  put<uint64_t>(out + 24, h.seq);
  put<uint64_t>(out + 32, h.total);
  put<uint64_t>(out + 40, h.offset);
}

DecodeStatus decodeFrame(const uint8_t* p, size_t n, FrameHeader* h, std::string* why) {
  if (n < kFrameHeaderBytes) return DecodeStatus::kNeedMore;
  auto invalid = [&](const std::string& s) {
    fail(why, s);
    return DecodeStatus::kInvalid;
  };
  uint32_t magic = get<uint32_t>(p);
  if (magic != kFrameMagic) return invalid("bad frame magic " + hex(magic));
  h->version = p[4];
  if (h->version != kFrameVersion) {
    return invalid("frame version " + std::to_string(h->version) + ", expected " +
                   std::to_string(kFrameVersion));
  }
  if (p[5] != static_cast<uint8_t>(Opcode::kData) && p[5] != static_cast<uint8_t>(Opcode::kGoodbye)) {
    return invalid("unknown frame opcode " + std::to_string(p[5]));
  }
  h->opcode = static_cast<Opcode>(p[5]);
  h->flags = get<uint16_t>(p + 6);
  if (h->flags != 0) return invalid("unknown frame flags " + hex(h->flags));
  h->source = get<uint32_t>(p + 8);
  h->chunk = get<uint32_t>(p + 12);
  h->tag = get<uint64_t>(p + 16);
  h->seq = get<uint64_t>(p + 24);
  h->total = get<uint64_t>(p + 32);
  h->offset = get<uint64_t>(p + 40);
  if (h->opcode == Opcode::kGoodbye) {
    if (h->chunk > kMaxGoodbyeBytes || h->tag || h->seq || h->total || h->offset) {
      return invalid("goodbye frame of " + std::to_string(h->chunk) +
                     " bytes with non-zero message fields, or longer than " +
                     std::to_string(kMaxGoodbyeBytes));
    }
    return DecodeStatus::kOk;
  }
  std::string where = "message " + std::to_string(h->seq) + " (total " +
                      std::to_string(h->total) + " bytes): chunk of " +
                      std::to_string(h->chunk) + " bytes at offset " + std::to_string(h->offset);
  if (h->chunk > kMaxChunkBytes) {
    return invalid(where + " exceeds the largest chunk, " + std::to_string(kMaxChunkBytes));
  }
  if (h->total > kMaxMessageBytes) {
    return invalid(where + ": total exceeds the largest message, " +
                   std::to_string(kMaxMessageBytes));
  }
  // offset + chunk <= total, written so that nothing can overflow.
  if (h->offset > h->total || h->chunk > h->total - h->offset) {
    return invalid(where + " ends beyond the message");
  }
  if (h->chunk == 0 && h->total != 0) return invalid(where + ": empty chunk");
  return DecodeStatus::kOk;
}

bool SocketOrder::check(const FrameHeader& h, std::string* why) {
  if (h.source != peer_) {
    return fail(why, "frame claims source rank " + std::to_string(h.source) + " on the socket of rank " +
                         std::to_string(peer_));
  }
  if (h.opcode == Opcode::kGoodbye) return true;  // the last frame: no order to keep
  bool forward = !any_ || h.seq > seq_ || (h.seq == seq_ && h.offset >= end_ && h.chunk > 0);
  if (!forward) {
    return fail(why, "out-of-order frame: message " + std::to_string(h.seq) + " offset " +
                         std::to_string(h.offset) + " after message " + std::to_string(seq_) +
                         " up to offset " + std::to_string(end_));
  }
  any_ = true;
  seq_ = h.seq;
  end_ = h.offset + h.chunk;  // <= total, checked by decodeFrame
  return true;
}

bool checkMessage(const FrameHeader& h, uint64_t tag, uint64_t total, uint64_t* received,
                  std::string* why) {
  if (h.tag != tag || h.total != total) {
    return fail(why, "frame of message " + std::to_string(h.seq) + " says tag " +
                         std::to_string(h.tag) + ", " + std::to_string(h.total) +
                         " bytes; its first frame said tag " + std::to_string(tag) + ", " +
                         std::to_string(total) + " bytes");
  }
  if (h.chunk > total - *received) {
    return fail(why, "message " + std::to_string(h.seq) + " receives " +
                         std::to_string(*received) + " + " + std::to_string(h.chunk) +
                         " bytes, more than its total " + std::to_string(total));
  }
  *received += h.chunk;
  return true;
}

}  // namespace tcp
}  // namespace transport
}  // namespace braid
