#include "transport/store.h"

#include <algorithm>

#include "common/error.h"

namespace braid {
namespace transport {

std::vector<std::string> exchangeThroughStore(Store& store,
                                              const std::function<std::string(int)>& key, int rank,
                                              int size, const std::string& mine,
                                              std::chrono::steady_clock::time_point deadline,
                                              std::string* missing) {
  using std::chrono::milliseconds;
  store.set(key(rank), {mine.begin(), mine.end()});
  std::vector<std::string> values(size);
  for (int r = 0; r < size; ++r) {
    auto left =
        std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    try {
      std::vector<uint8_t> v = store.get(key(r), std::max(left, milliseconds(1)));
      values[r].assign(v.begin(), v.end());
    } catch (const TimeoutError&) {
      missing->clear();
      for (int m = r; m < size; ++m) {  // which of the rest never came
        try {
          store.get(key(m), milliseconds(1));
        } catch (const TimeoutError&) {
          *missing += (missing->empty() ? "" : ",") + std::to_string(m);
        }
      }
      return {};
    }
  }
  return values;
}

}  // namespace transport
}  // namespace braid
