// Note [No exception out of teardown] in teardown.h.
#include "cuda/teardown.h"

#include <atomic>
#include <exception>
#include <mutex>
#include <set>

#include "common/logging.h"

namespace braid {
namespace cuda {
namespace {
std::atomic<uint64_t> gErrors{0};
}  // namespace

void ignoreTeardownError(const char* what, int rank, const std::function<void()>& fn) noexcept {
  try {
    fn();
    return;
  } catch (const std::exception& e) {
    gErrors.fetch_add(1, std::memory_order_relaxed);
    try {
      // Leaked on purpose: teardown may run during static destruction.
      static auto* mu = new std::mutex;
      static auto* logged = new std::set<const char*>;
      std::lock_guard<std::mutex> lock(*mu);
      if (logged->insert(what).second) {
        BRAID_LOG(kWarn, "cuda", rank)
            << what << ": " << e.what()
            << " (ignored: teardown goes on; later failures here are not logged)";
      }
    } catch (...) {
    }
  } catch (...) {
    gErrors.fetch_add(1, std::memory_order_relaxed);
  }
}

uint64_t teardownErrors() { return gErrors.load(std::memory_order_relaxed); }

}  // namespace cuda
}  // namespace braid
