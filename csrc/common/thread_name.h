// Names braid's own threads ("braid-worker", "braid-p2p") so that tools and
// tests can tell them from torch's and the OS's: /proc/<pid>/task/*/comm, top -H,
// gdb's "info threads". Leak checks count only these (tests/python/harness.py).
#pragma once

#include <pthread.h>

namespace braid {

// Linux keeps at most 15 characters of a thread's name.
inline void nameThisThread(const char* name) { pthread_setname_np(pthread_self(), name); }

}  // namespace braid
