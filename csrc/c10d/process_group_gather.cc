// The gathering and scattering collectives: allgather (list, flat and
// coalesced forms), gather and scatter. reduce_scatter and alltoall are in
// process_group_exchange.cc.
#include "c10d/coalesced_work.h"
#include "c10d/process_group.h"
#include "c10d/tensor_args.h"
#include "cuda/nccl/nccl_executor.h"
#include "engine/engine.h"
#include "collectives/shm/collectives.h"
#include "common/error.h"

namespace braid {

using args::Staged;
using collectives::OpDesc;
using collectives::OpKind;

namespace {

std::vector<Staged> stageOutputs(const std::vector<at::Tensor>& ts) {
  std::vector<Staged> out;
  for (auto& t : ts) out.push_back(Staged::out(t));
  return out;
}

std::vector<void*> pointers(const std::vector<Staged>& st) {
  std::vector<void*> p;
  for (auto& s : st) p.push_back(s.data());
  return p;
}

// n equal views of a flat contiguous buffer.
std::vector<void*> slices(const at::Tensor& flat, int n) {
  std::vector<void*> p(n);
  size_t bytes = flat.numel() * flat.element_size() / n;
  for (int r = 0; r < n; ++r) p[r] = static_cast<uint8_t*>(flat.data_ptr()) + r * bytes;
  return p;
}

void copyBackAll(const std::vector<Staged>& st) {
  for (auto& s : st) s.copyBack();
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return guarded(OpKind::kAllgather, [&] {
    const int rank = getRank(), n = getSize();
    const at::Tensor& in = args::single(inputs, "allgather", rank);
    OpDesc d = describe(OpKind::kAllgather, in, "allgather", opts.timeout);
    BRAID_ENFORCE(outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(n), "allgather",
                  rank, "expects one output list of ", n, " tensors");
    args::checkSame(outputs[0], d.dtype, in.numel(), "output", "allgather", rank);
    auto src = Staged::in(in);
    auto outs = stageOutputs(outputs[0]);
    Engine* e = engine_.get();
    return launch(d, c10d::OpType::ALLGATHER, "braid:allgather", outputs[0], [e, d, src, outs] {
      e->group().allgather(d, src.data(), pointers(outs).data());
      copyBackAll(outs);
    }, inputs);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  return guarded(OpKind::kAllgather, [&] {
    const int rank = getRank(), n = getSize();
    args::checkTensor(input, "allgather", rank);
    args::checkTensor(output, "allgather", rank);
    OpDesc d = describe(OpKind::kAllgather, input, "allgather", opts.timeout);
    args::checkSame({output}, d.dtype, input.numel() * n, "output", "allgather", rank);
    if (onNccl(input, "allgather")) {
      return ncclLaunch(d, c10d::OpType::_ALLGATHER_BASE, "braid:_allgather_base", {output},
                        {input}, cuda::NcclOpKind::kAllgather, input.data_ptr(),
                        output.data_ptr(), 1.0);
    }
    auto src = Staged::in(input);
    auto dst = Staged::out(output);
    Engine* e = engine_.get();
    return launch(d, c10d::OpType::_ALLGATHER_BASE, "braid:_allgather_base", {output},
                  [e, d, src, dst, n] {
                    e->group().allgather(d, src.data(), slices(dst.buf, n).data());
                    dst.copyBack();
                  }, input);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  BRAID_ENFORCE(outputs.size() == inputs.size(), "allgather", getRank(), "got ", outputs.size(),
                " outputs for ", inputs.size(), " inputs");
  // One Work for the call (Note [Coalesced calls] in c10d/coalesced_work.h).
  return issueCoalesced(
      getRank(), inputs.size(),
      [&](size_t i) { return _allgather_base(outputs[i], inputs[i], opts); },
      [&](size_t, const std::string& why) {
        try {
          guarded(OpKind::kAllgather, [&]() -> c10::intrusive_ptr<c10d::Work> {
            throw Error(why);
          });
        } catch (const Error&) {
          // The caller gets op i's own error.
        }
      },
      compat::kCoalescedOpType, "braid:allgather_into_tensor_coalesced");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return guarded(OpKind::kAllgather, [&] {
    const int rank = getRank(), n = getSize();
    BRAID_ENFORCE(outputLists.size() == static_cast<size_t>(n), "allgather_coalesced", rank,
                  "expects one output list per rank (", n, "), got ", outputLists.size());
    std::vector<Staged> ins;
    int64_t packedBytes = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      args::checkTensor(inputs[i], "allgather_coalesced", rank);
      args::dtypeOf(inputs[i], "allgather_coalesced", rank);
      ins.push_back(Staged::in(inputs[i]));
      packedBytes += inputs[i].nbytes();
    }
    for (int r = 0; r < n; ++r) {
      BRAID_ENFORCE(outputLists[r].size() == inputs.size(), "allgather_coalesced", rank,
                    "output list ", r, " has ", outputLists[r].size(), " tensors, expected ",
                    inputs.size());
      for (size_t i = 0; i < inputs.size(); ++i) {
        BRAID_ENFORCE(outputLists[r][i].nbytes() == inputs[i].nbytes(), "allgather_coalesced",
                      rank, "output ", r, "/", i, " has ", outputLists[r][i].nbytes(),
                      " bytes, input ", i, " has ", inputs[i].nbytes());
      }
    }
    std::vector<at::Tensor> outs;
    std::vector<Staged> outSt;
    for (auto& l : outputLists) {
      for (auto& t : l) {
        args::checkTensor(t, "allgather_coalesced", rank);
        outs.push_back(t);
        outSt.push_back(Staged::out(t));
      }
    }
    OpDesc d = desc(OpKind::kAllgather, opts.timeout);
    d.dtype = DataType::kUInt8;
    d.count = packedBytes;
    d.shape.ndim = 1;
    d.shape.dims[0] = packedBytes;
    Engine* e = engine_.get();
    // Packing and unpacking run on the worker, where CUDA tensors' values
    // have reached their staging buffers.
    return launch(d, c10d::OpType::ALLGATHER_COALESCED, "braid:allgather_coalesced", outs,
                  [e, d, ins, outSt, n] {
                    std::vector<at::Tensor> flat;
                    for (auto& st : ins) flat.push_back(st.buf.reshape({-1}).view(at::kByte));
                    at::Tensor packed = flat.empty() ? at::empty({0}, at::kByte) : at::cat(flat);
                    at::Tensor gathered = at::empty({packed.numel() * n}, at::kByte);
                    e->group().allgather(d, packed.data_ptr(), slices(gathered, n).data());
                    size_t k = 0;
                    for (int r = 0; r < n; ++r) {
                      int64_t off = r * packed.numel();
                      for (size_t i = 0; i < ins.size(); ++i, ++k) {
                        const Staged& st = outSt[k];
                        auto bytes = gathered.narrow(0, off, st.buf.nbytes());
                        st.buf.copy_(bytes.view(st.buf.scalar_type()).view(st.buf.sizes()));
                        st.copyBack();
                        off += st.buf.nbytes();
                      }
                    }
                  }, inputs);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  return guarded(OpKind::kGather, [&] {
    const int rank = getRank(), n = getSize();
    const at::Tensor& in = args::single(inputs, "gather", rank);
    args::checkRank(static_cast<int>(opts.rootRank), n, "root", "gather", rank);
    OpDesc d = describe(OpKind::kGather, in, "gather", opts.timeout);
    d.root = static_cast<int>(opts.rootRank);
    std::vector<at::Tensor> outList;
    if (rank == d.root) {
      BRAID_ENFORCE(outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(n), "gather",
                    rank, "the root expects one output list of ", n, " tensors");
      args::checkSame(outputs[0], d.dtype, in.numel(), "output", "gather", rank);
      outList = outputs[0];
    } else {
      BRAID_ENFORCE(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()), "gather",
                    rank, "only the root (", d.root, ") takes output tensors");
    }
    if (onNccl(in, "gather", cuda::NcclOpKind::kGather)) {
      cuda::NcclOp op;
      op.kind = cuda::NcclOpKind::kGather;
      op.in = in.data_ptr();
      for (auto& t : outList) op.outs.push_back(t.data_ptr());
      return ncclLaunch(d, c10d::OpType::GATHER, "braid:gather", outList, inputs, std::move(op));
    }
    auto src = Staged::in(in);
    auto outs = stageOutputs(outList);
    Engine* e = engine_.get();
    return launch(d, c10d::OpType::GATHER, "braid:gather", outList, [e, d, src, outs] {
      e->group().gather(d, src.data(), pointers(outs).data());
      copyBackAll(outs);
    }, inputs);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  return guarded(OpKind::kScatter, [&] {
    const int rank = getRank(), n = getSize();
    const at::Tensor& out = args::single(outputs, "scatter", rank);
    args::checkRank(static_cast<int>(opts.rootRank), n, "root", "scatter", rank);
    OpDesc d = describe(OpKind::kScatter, out, "scatter", opts.timeout);
    d.root = static_cast<int>(opts.rootRank);
    if (rank == d.root) {
      BRAID_ENFORCE(inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(n), "scatter",
                    rank, "the root expects one input list of ", n, " tensors");
      args::checkSame(inputs[0], d.dtype, out.numel(), "input", "scatter", rank);
    } else {
      BRAID_ENFORCE(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()), "scatter", rank,
                    "only the root (", d.root, ") takes input tensors");
    }
    const std::vector<at::Tensor> inList = rank == d.root ? inputs[0] : std::vector<at::Tensor>();
    if (onNccl(out, "scatter", cuda::NcclOpKind::kScatter)) {
      cuda::NcclOp op;
      op.kind = cuda::NcclOpKind::kScatter;
      op.out = out.data_ptr();
      for (auto& t : inList) op.ins.push_back(t.data_ptr());
      return ncclLaunch(d, c10d::OpType::SCATTER, "braid:scatter", outputs, inList, std::move(op));
    }
    std::vector<Staged> ins;
    for (auto& t : inList) ins.push_back(Staged::in(t));
    auto dst = Staged::out(out);
    Engine* e = engine_.get();
    return launch(d, c10d::OpType::SCATTER, "braid:scatter", outputs, [e, d, ins, dst] {
      std::vector<const void*> p;
      for (auto& s : ins) p.push_back(s.data());
      e->group().scatter(d, p.data(), dst.data());
      dst.copyBack();
    }, inputs.empty() ? c10::ArrayRef<at::Tensor>() : c10::ArrayRef<at::Tensor>(inputs[0]));
  });
}

}  // namespace braid
