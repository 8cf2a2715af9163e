// Copies whose destination the copying thread will not read again soon.
//
// Note [Non-temporal copies]
// A plain store first reads the destination's cache line (to own it), so
// copying n bytes to memory that is not in cache moves 3n bytes over the
// memory bus: n read, n read for ownership, n written back. A registered
// allreduce (Note [Registered buffers]) writes each reduced slice into every
// peer's buffer, which the writer never reads again and the peer reads only
// later: non-temporal stores skip the read for ownership and keep those
// lines out of the writer's cache. They are weakly ordered, so the copy ends
// with a store fence: whatever is published after it (a step counter) is
// seen after the data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace braid {

inline void copyNonTemporal(void* dst, const void* src, size_t n) {
#if defined(__SSE2__)
  auto* d = static_cast<uint8_t*>(dst);
  auto* s = static_cast<const uint8_t*>(src);
  size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  if (head > n) head = n;
  if (head) std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  const size_t body = n & ~static_cast<size_t>(63);
  for (size_t i = 0; i < body; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  if (n > body) std::memcpy(d + body, s + body, n - body);
  _mm_sfence();
#else
  if (n) std::memcpy(dst, src, n);
#endif
}

}  // namespace braid
