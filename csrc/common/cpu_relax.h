// One iteration's pause in a spin-wait loop: lets the sibling hyperthread run
// and saves power, without giving up the core (Note [Spin, then sleep] in
// transport/shm/futex.h says why braid never yields instead).
#pragma once

namespace braid {

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace braid
