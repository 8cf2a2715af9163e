// Start-of-training agreement between DDP ranks: same parameter shapes
// everywhere, and rank 0's values for parameters and buffers.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

namespace braid {

// Throws braid::Error on every rank, naming the first parameter (name, index,
// both shapes and dtypes, both ranks) that differs from rank 0, or the ranks
// whose parameter counts differ. Collective: one allgather of two int64s, one
// of the shape metadata.
void verifyParamsAcrossRanks(const c10::intrusive_ptr<c10d::ProcessGroup>& pg,
                             const std::vector<at::Tensor>& params,
                             const std::vector<std::string>& names);

// Overwrites `tensors` with root's values, flattened into one broadcast per
// dtype and device (split at chunkBytes). Collective; tensors must agree in
// order, shapes and dtypes across ranks.
void broadcastCoalesced(const c10::intrusive_ptr<c10d::ProcessGroup>& pg,
                        const std::vector<at::Tensor>& tensors, int root = 0,
                        int64_t chunkBytes = int64_t(256) << 20);

}  // namespace braid
