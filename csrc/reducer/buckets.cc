#include "reducer/buckets.h"

#include <algorithm>
#include <map>

#include "common/error.h"

namespace braid {

std::vector<std::vector<size_t>> assignBuckets(const std::vector<BucketParam>& params,
                                               const std::vector<size_t>& order,
                                               const std::vector<int64_t>& limits) {
  BRAID_ENFORCE(!limits.empty(), "ddp", -1, "bucket size limits are empty");
  BRAID_ENFORCE(order.size() == params.size(), "ddp", -1, "bucket order has ", order.size(),
                " entries for ", params.size(), " parameters");
  struct Open {
    std::vector<size_t> members;
    int64_t bytes = 0;
    size_t closed = 0;  // buckets already closed for this key: picks the limit
  };
  std::map<int, Open> open;
  std::vector<std::vector<size_t>> result;
  std::vector<bool> seen(params.size(), false);
  for (size_t i : order) {
    BRAID_ENFORCE(i < params.size() && !seen[i], "ddp", -1,
                  "bucket order is not a permutation: ", "index ", i,
                  " is out of range or repeated");
    seen[i] = true;
    Open& b = open[params[i].key];
    b.members.push_back(i);
    b.bytes += params[i].bytes;
    int64_t limit = limits[std::min(b.closed, limits.size() - 1)];
    if (b.bytes >= limit) {
      result.push_back(std::move(b.members));
      b.members.clear();
      b.bytes = 0;
      ++b.closed;
    }
  }
  for (auto& kv : open) {
    if (!kv.second.members.empty()) result.push_back(std::move(kv.second.members));
  }
  std::vector<size_t> position(params.size());
  for (size_t p = 0; p < order.size(); ++p) position[order[p]] = p;
  std::stable_sort(result.begin(), result.end(),
                   [&](const std::vector<size_t>& a, const std::vector<size_t>& b) {
                     return position[a.front()] < position[b.front()];
                   });
  return result;
}

}  // namespace braid
