// Which parameters share a gradient bucket. Pure bookkeeping, no torch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace braid {

struct BucketParam {
  int64_t bytes;  // gradient size
  int key;        // parameters with different keys (dtype, device) never share a bucket
};

// Visits `params` in `order` and fills one open bucket per key; a bucket
// closes once it holds at least its limit (so a bucket may exceed it by one
// parameter, and a parameter larger than the limit gets a bucket of its own).
// The i-th bucket closed for a key uses limits[i], the last limit repeating:
// {1 MiB, 25 MiB} makes each key's first bucket small so that communication
// starts early in backward.
//
// Returns parameter indices per bucket, each bucket in visit order, buckets
// sorted by the position of their first parameter in `order`: if `order` is
// the order in which gradients become ready, buckets fill up in index order.
std::vector<std::vector<size_t>> assignBuckets(const std::vector<BucketParam>& params,
                                               const std::vector<size_t>& order,
                                               const std::vector<int64_t>& limits);

}  // namespace braid
