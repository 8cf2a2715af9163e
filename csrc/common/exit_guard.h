// Dropping references on braid's own threads while the interpreter exits.
//
// Note [Dropping Python objects at exit]
// A job's closure, a Work, a p2p callback hold tensors, and a tensor whose
// Python object is alive takes the GIL when its last C++ reference goes
// (TensorImpl::destroy_pyobj_if_needed). While Python finalizes, a thread
// other than the main one that takes the GIL is ended with pthread_exit, whose
// unwinding through a destructor (noexcept) calls std::terminate: a process
// that called sys.exit() with a braid op in flight aborted (found by the
// fault-injection suite, about 1 run in 45 of allgather + exit(1)). So braid's
// threads drop such objects through dropOrLeak(), and the Python module calls
// beginExit() from an atexit hook, which runs before finalization: from then
// on the objects are leaked (the process is ending), and beginExit() returns
// only once no thread is still inside a drop that began before it, so none
// can be waiting for the GIL when finalization starts.
#pragma once

#include <atomic>
#include <utility>

namespace braid {

namespace exit_guard {
extern std::atomic<bool> exiting;
extern std::atomic<int> dropping;
}  // namespace exit_guard

// Called once, at interpreter exit, without the GIL (see the Note).
void beginExit();

// Destroys `obj` (moved from), or leaks it after beginExit().
template <typename T>
void dropOrLeak(T& obj) {
  exit_guard::dropping.fetch_add(1);
  if (exit_guard::exiting.load()) {
    exit_guard::dropping.fetch_sub(1);
    new T(std::move(obj));  // deliberately leaked: see the Note
    return;
  }
  {
    T dead(std::move(obj));
  }
  exit_guard::dropping.fetch_sub(1);
}

}  // namespace braid
