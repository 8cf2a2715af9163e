// Note [Registered buffers] in registered.h.
#include "collectives/shm/registered.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "collectives/reduce_share.h"
#include "collectives/shm/communicator.h"
#include "common/error.h"
#include "common/logging.h"
#include "common/settings.h"
#include "common/stream_copy.h"

namespace braid {
namespace collectives {

BRAID_SETTING_BOOL(kSharedBuffers, "BRAID_SHARED_BUFFERS", true,
                   "Let braid's DDP reducer keep its gradient buckets in memory every rank of a "
                   "single-host group maps, so that their allreduce reads and writes the peers' "
                   "buckets in place (Note [Registered buffers]); 0: ordinary memory. Ranks that "
                   "disagree all use ordinary memory.");

void RegionTable::add(uint64_t id, Regions all) {
  std::lock_guard<std::mutex> lock(mu_);
  live_[id] = std::move(all);
}

bool RegionTable::find(const void* p, size_t bytes, Ref* out) const {
  const auto* b = static_cast<const uint8_t*>(p);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, regions] : live_) {
    const auto* base = static_cast<const uint8_t*>(regions[rank_]->data());
    if (b >= base && b + bytes <= base + regions[rank_]->size()) {
      *out = {id, static_cast<uint64_t>(b - base)};
      return true;
    }
  }
  return false;
}

RegionTable::Regions RegionTable::get(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(id);
  return it == live_.end() ? Regions{} : it->second;
}

void RegionTable::release(uint64_t id) {
  Regions dropped;  // unmapped outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(id);
  if (it == live_.end()) return;
  dropped = std::move(it->second);
  live_.erase(it);
}

void RegionTable::clear() {
  std::map<uint64_t, Regions> dropped;
  std::lock_guard<std::mutex> lock(mu_);
  dropped.swap(live_);
}

uint64_t registerBuffer(Communicator& c, const OpDesc& op,
                        const std::shared_ptr<transport::shm::SharedRegion>& mine) {
  using transport::shm::kRegionHandleBytes;
  using transport::shm::SharedRegion;
  const int n = c.size();
  const int me = c.rank();
  const uint64_t id = c.regions()->nextId();
  c.beginOp(op);
  const uint64_t s = c.nextStep();
  c.writeHeader(op, s, Algo::kHeaderOnly);
  const std::string handle = mine->handle();
  std::memcpy(c.slot(me, s), handle.data(), kRegionHandleBytes);
  c.exchange(op, s);  // the sizes agree from here on (Note [Op headers])
  RegionTable::Regions all(n);
  all[me] = mine;
  std::string why = kSharedBuffers.get() ? "" : "BRAID_SHARED_BUFFERS=0";
  for (int r = 0; r < n && why.empty(); ++r) {
    if (r == me) continue;
    try {
      all[r] = SharedRegion::open(
          std::string(reinterpret_cast<const char*>(c.slot(r, s)), kRegionHandleBytes),
          "register_buffer");
    } catch (const std::exception& e) {
      why = strCat("rank ", r, "'s region: ", e.what());
    }
  }
  // Everyone has read the handles; now agree on the outcome.
  const uint64_t s2 = c.nextStep();
  c.slot(me, s2)[0] = why.empty() ? 1 : 0;
  c.publish(s2);
  c.waitAll(s2);
  int failed = -1;
  for (int r = 0; r < n && failed < 0; ++r) {
    if (c.slot(r, s2)[0] != 1) failed = r;
  }
  if (failed >= 0) {
    BRAID_LOG(kInfo, "shm", me) << "buffer of " << mine->size()
                                << " bytes not registered: rank " << failed
                                << (why.empty() ? " could not map it" : " says: " + why);
    return 0;
  }
  c.regions()->add(id, std::move(all));
  return id;
}

void allreduceRegistered(Communicator& c, const OpDesc& op0, void* buf,
                         const RegionTable::Ref& ref) {
  OpDesc op = op0;
  op.inAddr = ref.offset;  // announced, as direct reads announce addresses
  op.outAddr = ref.id;
  const uint64_t s0 = c.headerStep(op, Algo::kRegistered);
  const int n = c.size();
  const int me = c.rank();
  const RegionTable::Regions regions = c.regions()->get(ref.id);
  BRAID_ENFORCE(!regions.empty(), opName(op.kind), me, "registered region ", ref.id,
                " was released during the op");
  // Every rank checks every header: all of them throw, or none (Note [Op headers]).
  std::vector<uint8_t*> bufs(n);
  for (int r = 0; r < n; ++r) {
    const uint64_t id = c.outAddr(r, s0), off = c.inAddr(r, s0);
    BRAID_ENFORCE(id == ref.id, opName(op.kind), me, "the ranks' buffers lie in different "
                  "registered regions: rank ", r, "'s in region ", id, ", this rank's in region ",
                  ref.id, "; allreduce registered buffers that were allocated together");
    BRAID_ENFORCE(off + op.bytes() <= regions[r]->size(), opName(op.kind), me, "rank ", r,
                  "'s buffer (offset ", off, ", ", op.bytes(), " bytes) ends outside its region of ",
                  regions[r]->size(), " bytes");
    bufs[r] = static_cast<uint8_t*>(regions[r]->data()) + off;
  }
  const size_t es = elementSize(op.dtype);
  const size_t align = 64 / es ? 64 / es : 1;
  size_t b, e;
  partition(op.count, n, me, align, &b, &e);
  const size_t piece = std::max<size_t>(c.chunkBytes() / es, 1);
  std::vector<const void*> srcs(n);
  for (size_t at = b; at < e; at += piece) {
    const size_t len = std::min(piece, e - at);
    for (int r = 0; r < n; ++r) srcs[r] = bufs[r] + at * es;
    uint8_t* mineAt = bufs[me] + at * es;
    reduceShare(op, mineAt, srcs.data(), n, len);
    for (int r = 0; r < n; ++r) {
      if (r != me) copyNonTemporal(bufs[r] + at * es, mineAt, len * es);  // Note [Non-temporal copies]
    }
  }
  const uint64_t s = c.nextStep();  // peers have written their slices into this rank's buffer
  c.publish(s);
  c.waitAll(s);
}

}  // namespace collectives
}  // namespace braid
