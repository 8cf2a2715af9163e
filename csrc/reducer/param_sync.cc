#include "reducer/param_sync.h"

#include <map>
#include <sstream>
#include <tuple>

#include "common/error.h"

namespace braid {
namespace {

// One parameter as seen in the metadata stream: dtype, ndim, dims...
struct ParamMeta {
  int64_t dtype = -1;
  std::vector<int64_t> sizes;
  bool operator==(const ParamMeta& o) const { return dtype == o.dtype && sizes == o.sizes; }
};

std::string describe(const ParamMeta& m) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < m.sizes.size(); ++i) os << (i ? ", " : "") << m.sizes[i];
  os << "] (" << c10::toString(static_cast<c10::ScalarType>(m.dtype)) << ')';
  return os.str();
}

std::vector<ParamMeta> decode(const int64_t* p, int64_t len, int64_t count) {
  std::vector<ParamMeta> out;
  int64_t at = 0;
  for (int64_t i = 0; i < count && at + 2 <= len; ++i) {
    ParamMeta m;
    m.dtype = p[at];
    int64_t ndim = p[at + 1];
    at += 2;
    for (int64_t d = 0; d < ndim && at < len; ++d) m.sizes.push_back(p[at++]);
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<at::Tensor> allgather(const c10::intrusive_ptr<c10d::ProcessGroup>& pg,
                                  const at::Tensor& in) {
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < pg->getSize(); ++r) outputs[0].push_back(at::empty_like(in));
  std::vector<at::Tensor> inputs{in};
  pg->allgather(outputs, inputs)->wait();
  return outputs[0];
}

}  // namespace

void verifyParamsAcrossRanks(const c10::intrusive_ptr<c10d::ProcessGroup>& pg,
                             const std::vector<at::Tensor>& params,
                             const std::vector<std::string>& names) {
  const int rank = pg->getRank();
  std::vector<int64_t> meta;
  for (const auto& p : params) {
    meta.push_back(static_cast<int64_t>(p.scalar_type()));
    meta.push_back(p.dim());
    for (int64_t s : p.sizes()) meta.push_back(s);
  }
  const int64_t count = static_cast<int64_t>(params.size());
  auto heads = allgather(pg, at::tensor({count, static_cast<int64_t>(meta.size())}, at::kLong));
  int64_t maxLen = 0;
  for (int r = 0; r < pg->getSize(); ++r) {
    const int64_t* h = heads[r].data_ptr<int64_t>();
    const int64_t count0 = heads[0].data_ptr<int64_t>()[0];
    BRAID_ENFORCE(h[0] == count0, "ddp", rank, "ranks disagree on the number of parameters: rank ",
                  r, " has ", h[0], " but rank 0 has ", count0,
                  " (every rank must wrap the same model)");
    maxLen = std::max(maxLen, h[1]);
  }
  if (maxLen == 0) return;  // no parameters anywhere
  // Pad to the longest stream so one allgather carries every rank's shapes.
  meta.resize(static_cast<size_t>(maxLen), -1);
  auto metas = allgather(pg, at::tensor(meta, at::kLong));
  std::vector<std::vector<ParamMeta>> decoded;
  for (int r = 0; r < pg->getSize(); ++r) {
    decoded.push_back(decode(metas[r].data_ptr<int64_t>(), heads[r].data_ptr<int64_t>()[1], count));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    for (int r = 1; r < pg->getSize(); ++r) {
      if (decoded[r][i] == decoded[0][i]) continue;
      BRAID_THROW(::braid::Error, "ddp", rank, "parameter '", names[i], "' (index ", i,
                  ") differs across ranks: ", describe(decoded[0][i]), " on rank 0 but ",
                  describe(decoded[r][i]), " on rank ", r,
                  " (every rank must wrap the same model, with parameters in the same order)");
    }
  }
}

void broadcastCoalesced(const c10::intrusive_ptr<c10d::ProcessGroup>& pg,
                        const std::vector<at::Tensor>& tensors, int root, int64_t chunkBytes) {
  at::NoGradGuard noGrad;
  // Chunks of tensors sharing dtype and device, in first-appearance order.
  std::vector<std::vector<at::Tensor>> chunks;
  std::map<std::tuple<int, int, int>, std::pair<size_t, int64_t>> openChunk;  // -> index, bytes
  for (const auto& t : tensors) {
    if (t.numel() == 0) continue;
    auto key =
        std::make_tuple(static_cast<int>(t.scalar_type()), static_cast<int>(t.device().type()),
                        static_cast<int>(t.device().index()));
    auto it = openChunk.find(key);
    int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    if (it == openChunk.end() || it->second.second + bytes > chunkBytes) {
      chunks.emplace_back();
      openChunk[key] = {chunks.size() - 1, 0};
      it = openChunk.find(key);
    }
    chunks[it->second.first].push_back(t);
    it->second.second += bytes;
  }
  std::vector<std::pair<at::Tensor, c10::intrusive_ptr<c10d::Work>>> inFlight;
  for (const auto& chunk : chunks) {
    std::vector<at::Tensor> flat;
    for (const auto& t : chunk) flat.push_back(t.reshape({-1}));
    std::vector<at::Tensor> buf{at::cat(flat)};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    inFlight.emplace_back(buf[0], pg->broadcast(buf, opts));
  }
  for (size_t c = 0; c < chunks.size(); ++c) {
    inFlight[c].second->wait();
    if (pg->getRank() == root) continue;
    int64_t offset = 0;
    for (auto& t : chunks[c]) {
      at::Tensor dst = t;  // shallow copy: copy_ writes into the caller's storage
      dst.copy_(inFlight[c].first.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

}  // namespace braid
