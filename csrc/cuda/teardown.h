// Freeing and destroying without throwing: destructors, deleters and other
// noexcept paths that reach a DeviceApi or NCCL call.
//
// Note [No exception out of teardown]
// Every DeviceApi call throws on a CUDA error, and the calls that free
// (cudaFreeHost, cudaFree, cudaStreamDestroy, cudaEventDestroy) fail too:
// after a sticky device error (cudaErrorIllegalAddress: every later call in
// the process fails the same way) and late at exit (cudaErrorCudartUnloading).
// Reached from a destructor or a tensor's deleter, such an exception
// terminates the process (destructors are noexcept; c10's deleters run from
// one). So teardown runs its calls through ignoreTeardownError: the error
// is logged, once per call site (a sticky error fails every block of a pool,
// and a log line each says nothing new), counted for tests, and the teardown
// goes on; the memory or handle is the runtime's to reclaim then.
#pragma once

#include <cstdint>
#include <functional>

namespace braid {
namespace cuda {

// Runs `fn`; an exception from it is logged as "<what>: <error>" (the first
// per `what`, which must be a string literal: the site) and dropped.
void ignoreTeardownError(const char* what, int rank, const std::function<void()>& fn) noexcept;

// Failures ignoreTeardownError dropped so far in this process.
uint64_t teardownErrors();

}  // namespace cuda
}  // namespace braid
