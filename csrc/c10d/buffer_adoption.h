// Moving a CPU buffer that is allreduced again and again (a DDP gradient
// bucket) into registered memory, so that its allreduce reads and writes the
// peers' copies in place.
//
// Note [Adopting a repeated buffer]
// braid's own reducer allocates its buckets in registered memory (Note
// [Registered buffers] in collectives/shm/registered.h), and its allreduce
// then moves each byte once. PyTorch's DDP allocates its buckets itself
// (at::empty), so every step of its allreduce goes through the slots: copy
// in, reduce, copy out, several more passes over 25 MB buckets on a host
// whose cores all compute (issue 31). The buffer can move instead:
// - Which buffers: a dense contiguous CPU tensor that covers its whole
//   storage, of at least BRAID_ADOPT_MIN_BYTES, whose memory came from the
//   CPU allocator (its DataPtr's deleter is the allocator's: not from_blob,
//   numpy, shared or pinned memory, whose owners expect their own pointer),
//   that other tensors view (a bucket's per-parameter views; a lone tensor is
//   left alone), and that this group allreduced (SUM, MAX, ..., not
//   PREMUL_SUM, which reduces a scaled copy) at least twice before from the
//   same storage at the same address. DDP's buckets are all of that from
//   their third step on.
// - Agreement: such an op sets OpDesc::offersBuffer, which its header
//   carries. It is not compared like a setting: ranks may legitimately
//   differ (one rank's tensor viewed, another's not), and then nothing
//   moves. After the header step every rank knows whether all offered
//   (Group::everyRankOffered, the same answer everywhere since every rank
//   reads every header). If they did, right after the allreduce, every rank
//   registers a region of the buffer's size (registerBuffer, a collective
//   of its own that all of them now run at the same point), copies the
//   reduced values into it and swaps the storage's DataPtr for it
//   (StorageImpl::set_data_ptr, the same on torch 1.13 to 2.14). The old
//   memory goes back to the allocator. Every view of the storage (DDP's
//   gradient views, param.grad with gradient_as_bucket_view) now sees the
//   region, and the next allreduce of the bucket takes the registered path
//   on every rank alike. A registration that some rank refuses
//   (BRAID_SHARED_BUFFERS=0, a peer it cannot map) returns 0 everywhere; the
//   buffer then stays and is not offered again.
// - Safety: the swap happens on the thread that runs the op, while the
//   Work is not complete; a caller may not touch a tensor during its
//   allreduce, and DDP does not touch a bucket until its future completes.
//   A raw pointer taken into the old memory before (data_ptr(), a numpy view
//   of the tensor, DLPack) would dangle afterwards: that is why only
//   allocator-owned storages that are viewed and repeatedly reduced move,
//   and why it is off unless BRAID_ADOPT_BUFFERS=1. The region is released when the
//   storage frees it (its deleter), after the group too if the storage
//   outlives it; peers keep their mappings as Note [Registered buffers] says.
// - Off by default. Measured on the 2-core VM (issue 31's MLP, PyTorch DDP
//   with bucket views, 4 alternating runs each), the step over the
//   no-communication step was 1.21-1.51x with it on, 1.30-1.46x off in the
//   same build: no gain beyond the noise. There the step is bound by DDP's
//   own passes over the bucket (its division, the copies in and out) more
//   than by the allreduce's staging; a host with spare memory bandwidth may
//   differ. Until it is measured to pay, the dangling-pointer risk above is
//   not worth taking by default.
// - Not moved: buffers on groups across hosts (no registered memory), CUDA
//   tensors, and those of allreduce_coalesced and of the fp16/bf16 hooks'
//   narrowed allreduce (paths of their own).
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "collectives/shm/communicator.h"

namespace braid {

class Engine;

class BufferAdoption {
 public:
  // When the group is made: a BufferAdoption where BRAID_ADOPT_BUFFERS=1,
  // else null, so that the default allreduce path pays one null check.
  static std::shared_ptr<BufferAdoption> makeIfEnabled();
  // Reads BRAID_ADOPT_MIN_BYTES.
  BufferAdoption();
  // Caller's thread, at an allreduce of `t` with reduce op `redop` (before
  // PREMUL_SUM is turned into SUM) on a group with registered memory:
  // whether this rank offers to move t's storage. Counts the sighting.
  bool offer(const at::Tensor& t, ReduceOp redop);
  // The op's thread, after an allreduce of `t` whose every rank offered:
  // registers a region through `e`'s group and moves t's storage into it.
  // Collective (every rank calls it alike). `d` is the allreduce's desc.
  void adopt(Engine* e, const collectives::OpDesc& d, const at::Tensor& t);
  uint64_t moved() const { return moved_.load(std::memory_order_relaxed); }

 private:
  struct Seen {
    const void* data;
    size_t bytes;
    int times;
  };
  const size_t minBytes_;
  std::mutex mu_;
  // By StorageImpl; a storage freed and another made at its address is told
  // apart by its data pointer and size.
  std::unordered_map<const void*, Seen> seen_;
  std::atomic<uint64_t> moved_{0};
};

}  // namespace braid
