// One Work for several ops: what endCoalescing() returns (Note [Coalescing]),
// and what the *_tensor_coalesced calls return (Note [Coalesced calls]).
#pragma once

#include <ATen/core/ivalue.h>

#include <functional>
#include <vector>

#include "c10d/compat.h"

namespace braid {

// Note [Coalescing]
// torch 2.x batches ops between Backend::startCoalescing() and
// endCoalescing() (batch_isend_irecv, _coalescing_manager with a device;
// NCCL turns them into one ncclGroupStart/End). braid's ops already run as
// soon as they are issued, in order, and never wait for a later op, so
// nothing needs batching: coalescing only collects the Works issued in the
// window, and endCoalescing() returns one Work for all of them.
//
// That Work completes when every op has ended, successfully or not, and
// never earlier: an op that failed early must not let the caller reuse
// buffers that later ops still read or write. Then its wait() rethrows, and
// its future holds, the error of the first op (in issue order) that failed;
// else the future holds every op's outputs in issue order, as result() does.
// An empty window gives a Work that is already complete, with no outputs.
class CoalescedWork : public c10d::Work {
 public:
  CoalescedWork(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> works,
                c10d::OpType type = compat::kCoalescedOpType,
                const char* title = "braid:coalesced");

  bool isCompleted() override;
  bool isSuccess() const override;
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override;

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// Note [Coalesced calls]
// reduce_scatter_tensor_coalesced and allgather_into_tensor_coalesced (torch
// 2.x; _coalescing_manager's fast path without a device) run one flat op per
// pair of tensors, and return one CoalescedWork for all of them, with the
// semantics above: every output, the first error, complete when all are.
// An empty list issues nothing and returns a completed Work with no outputs,
// as an empty coalescing window does (gloo's reduce_scatter_tensor_coalesced
// returns a Work that does nothing; its allgather_into_tensor_coalesced
// refuses an empty list, and NCCL indexes the first tensor of it).
// When op i's arguments fail on the calling rank, ops i+1.. are issued as
// failed ops too (`fail(j, error)`, a poison header each, Note [Op headers]),
// so that every rank runs as many ops as the call has and the ranks stay in
// step; then the caller gets the error, as from any op's argument check.
c10::intrusive_ptr<c10d::Work> issueCoalesced(
    int rank, size_t n, const std::function<c10::intrusive_ptr<c10d::Work>(size_t)>& issue,
    const std::function<void(size_t, const std::string&)>& fail, c10d::OpType type,
    const char* title);

}  // namespace braid
