// Names braid's own threads ("braid-worker", "braid-p2p") so that tools and
// tests can tell them from torch's and the OS's: /proc/<pid>/task/*/comm, top -H,
// gdb's "info threads". Leak checks count only these (tests/python/harness.py).
#pragma once

#include <pthread.h>

#include <thread>

namespace braid {

// Linux keeps at most 15 characters of a thread's name.
//
// Named by the thread that starts it, right after starting it: a thread that
// named itself would carry its creator's name ("python3") until it first
// ran, which on a loaded machine can be after its group has finished several
// ops (a leak check then counted one worker too few on torch 2.6 in CI).
inline std::thread& named(std::thread& t, const char* name) {
  pthread_setname_np(t.native_handle(), name);
  return t;
}

}  // namespace braid
