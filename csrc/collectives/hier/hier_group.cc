#include "collectives/hier/hier_group.h"

#include <algorithm>

#include "collectives/hier/stages.h"
#include "collectives/net/collectives.h"
#include "common/error.h"
#include "common/logging.h"
#include "common/settings.h"
#include "transport/routed.h"
#include "transport/shm/transport.h"
#include "transport/shm/window.h"
#include "transport/tcp/transport.h"

namespace braid {
namespace collectives {

// Compared in the world's header (Note [Settings that shape an op]).
BRAID_SETTING_INT_RENAMED(kHierMin, "BRAID_HIER_MIN_BYTES", "BRAID_HIER_ALLREDUCE_MIN", 64 << 10,
                  "Bytes (of the whole buffer; allgather and reduce_scatter: of all ranks' "
                  "blocks) from which allreduce, broadcast, reduce, allgather and reduce_scatter "
                  "across hosts run in stages: shared memory within each host, TCP between hosts "
                  "(Note [Collectives across hosts]); below, and where hosts run different numbers "
                  "of ranks, every rank exchanges over TCP. Must be equal on every rank. Formerly "
                  "BRAID_HIER_ALLREDUCE_MIN, still read when this one is unset.");
BRAID_SETTING_INT(kHierPiece, "BRAID_HIER_PIPELINE_BYTES", 4 << 20,
                  "Bytes per piece of a staged op across hosts (of each block, for allgather and "
                  "reduce_scatter): the pieces go through the stages one after another, the TCP "
                  "stage of one overlapping the shared-memory stages of its neighbours (Note "
                  "[Pipelined stages]; 2x2 hosts at 1 Gbit/s, 64 MiB allreduce: 609 ms with one "
                  "piece, 564 ms with 4 MiB); 0: one piece. Must be equal on every rank.");

BRAID_SETTING_INT(kShmDirectMin, "BRAID_SHM_MSG_DIRECT_MIN", 256 << 10,
                  "Bytes from which a collective's message between two ranks of one host, in a "
                  "group across hosts, is read straight from the sender's memory (one copy, "
                  "process_vm_readv; needs BRAID_SHM_CMA) instead of going through the "
                  "point-to-point ring (Note [Messages read in place]); 0: never. Below it the "
                  "ring is faster (the sender need not wait for the receiver's answer): 2 "
                  "ranks as threads (benchmarks/host_transports.cc), round trip of 64 KiB 51-70 "
                  "us through the ring, 95-102 us read in place; of 16 MiB 11.8-12.4 ms and "
                  "5.8-6.6 ms.");

namespace {

// "rank 5 on host 'b'": the host's name is its identity's first field.
std::string label(const transport::Topology& topo, int rank) {
  const std::string& id = topo.identityOf(topo.hostOf(rank));
  return strCat("rank ", rank, " on host '", id.substr(0, id.find('/')), "'");
}

bool evenHosts(const transport::Topology& topo) {
  for (int h = 1; h < topo.numHosts(); ++h) {
    if (topo.ranksOn(h).size() != topo.ranksOn(0).size()) return false;
  }
  return true;
}

transport::tcp::TcpOptions tcpOptions(const transport::Topology& topo, const HierOptions& o,
                                      const std::string& sub, std::vector<int> ranks) {
  auto t = transport::tcp::TcpOptions::fromEnv(topo.rank(), topo.size());
  t.groupId = o.groupId + "/" + sub;
  t.storeHost = o.storeHost;
  t.acrossHosts = true;
  t.timeout = o.timeout;
  t.logRank = topo.rank();  // a cross group's rank is its host's index: log the world's
  for (int r : ranks) t.peerNames.push_back(label(topo, r));
  return t;
}

// All ranks, TCP to other hosts and shared memory within this one when it
// runs more than one rank (Note [Routing by host] in transport/routed.h).
// `sub` names the group in handshakes and store keys ("world", "p2p");
// `directMin`: WindowOptions::directMin.
std::unique_ptr<transport::Transport> connectRouted(transport::Store& store,
                                                    const transport::Topology& topo,
                                                    transport::tcp::TcpOptions tcp,
                                                    const std::string& sub, size_t directMin,
                                                    std::chrono::milliseconds timeout) {
  const int rank = topo.rank(), n = topo.size(), h = topo.host();
  const std::vector<int>& here = topo.ranksOn(h);
  transport::PrefixedStore tcpStore(store, strCat("tcp/", sub, "/"));
  if (here.size() == 1) return transport::tcp::connect(tcpStore, rank, n, tcp);
  tcp.skip.assign(n, false);
  for (int r : here) tcp.skip[r] = r != rank;
  transport::shm::WindowOptions w;
  w.slotBytes = std::max<size_t>(4096, 64 * here.size());  // only the rings carry messages
  w.timeout = timeout;
  w.logRank = rank;
  w.directMin = directMin;
  for (int r : here) w.peerNames.push_back(label(topo, r));
  transport::PrefixedStore shmStore(store, strCat("shm-", sub, "/", h, "/"));
  auto local = transport::shm::connect(shmStore, topo.localRank(), here.size(), w);
  auto remote = transport::tcp::connect(tcpStore, rank, n, tcp);
  return std::make_unique<transport::RoutedTransport>(rank, n, here, std::move(local),
                                                      std::move(remote));
}

}  // namespace

HierGroup::HierGroup(transport::Store& store, const transport::Topology& topo,
                     const HierOptions& opts)
    : topo_(topo) {
  const int rank = topo.rank(), n = topo.size();
  net::NetConfig cfg = net::NetConfig::fromEnv(rank);
  BRAID_ENFORCE(kHierMin.get() >= 0, "init", rank, "BRAID_HIER_MIN_BYTES must be >= 0, got ",
                kHierMin.get());
  cfg.hierMinBytes = static_cast<uint64_t>(kHierMin.get());
  BRAID_ENFORCE(kHierPiece.get() >= 0, "init", rank,
                "BRAID_HIER_PIPELINE_BYTES must be >= 0, got ", kHierPiece.get());
  cfg.hierPieceBytes = static_cast<uint64_t>(kHierPiece.get());
  const int L = topo.localSize(), l = topo.localRank(), h = topo.host();
  const bool hostGroups = L > 1 && evenHosts(topo);
  // Read once: the host group runs with these, and the world's headers carry
  // them (NetConfig::local).
  if (hostGroups) cfg.local = CollectiveConfig::fromEnv(rank);

  std::vector<int> all(n);
  for (int r = 0; r < n; ++r) all[r] = r;
  BRAID_ENFORCE(kShmDirectMin.get() >= 0, "init", rank,
                "BRAID_SHM_MSG_DIRECT_MIN must be >= 0, got ", kShmDirectMin.get());
  worldT_ = connectRouted(store, topo, tcpOptions(topo, opts, "world", all), "world",
                          static_cast<size_t>(kShmDirectMin.get()), opts.timeout);
  world_ = std::make_unique<net::NetComm>(*worldT_, cfg);
  // Note [Point-to-point across hosts]: sockets of their own, made on first use.
  auto p2pOpts = tcpOptions(topo, opts, "p2p", all);
  p2pOpts.connect = transport::tcp::ConnectMode::kLazy;
  // Every message through the rings: a send completes once its bytes are
  // buffered, as on one host, not when the receive is posted.
  p2pT_ = connectRouted(store, topo, p2pOpts, "p2p", 0, opts.timeout);

  if (hostGroups) {
    std::vector<int> peers;
    for (int k = 0; k < topo.numHosts(); ++k) peers.push_back(topo.ranksOn(k)[l]);
    // The sub-groups' errors number ranks as the sub-group does: say which.
    auto sub = [&](const char* what, const std::vector<int>& ranks, int as, auto&& make) {
      try {
        make();
      } catch (const Error& e) {
        std::string list;
        for (size_t i = 0; i < ranks.size(); ++i) list += strCat(i ? ", " : "", ranks[i]);
        std::string head = errorText("init", rank, "creating the ", what, " among ranks ", list,
                                     ", where this rank is rank ", as, " of ", ranks.size(), ": ");
        if (dynamic_cast<const TimeoutError*>(&e)) throw TimeoutError(head + e.what());
        if (dynamic_cast<const PeerLostError*>(&e)) throw PeerLostError(head + e.what());
        throw Error(head + e.what());
      }
    };
    sub("shared-memory group of this host", topo.ranksOn(h), l, [&] {
      transport::PrefixedStore shmStore(store, strCat("shm/", h, "/"));
      transport::shm::WindowOptions w;
      w.controlBytes = collectives::Communicator::controlBytesFor(L);
      w.timeout = opts.timeout;
      for (int r : topo.ranksOn(h)) w.peerNames.push_back(label(topo, r));
      local_ = std::make_unique<ShmGroup>(transport::shm::ShmWindow::create(shmStore, l, L, w),
                                          cfg.local);
    });
    sub("TCP group across hosts", peers, h, [&] {
      transport::PrefixedStore crossStore(store, strCat("tcp/cross", l, "/"));
      crossT_ = transport::tcp::connect(crossStore, h, topo.numHosts(),
                                        tcpOptions(topo, opts, strCat("cross", l), peers));
    });
    cross_ = std::make_unique<net::NetComm>(*crossT_, cfg);
    world_->setRelay(this);  // Note [Op headers across hosts]
  } else if (L > 1) {
    BRAID_LOG(kInfo, "init", rank) << "hosts run different numbers of ranks (" << topo.describe()
                                   << "): every op runs over the world group (TCP between "
                                      "hosts, shared memory within each)";
  }
}

HierGroup::~HierGroup() { close(); }

std::string HierGroup::describe() const {
  bool shared = false;
  for (int h = 0; h < topo_.numHosts(); ++h) shared |= topo_.ranksOn(h).size() > 1;
  return strCat("TCP across ", topo_.describe(), shared ? ", shared memory within each host" : "");
}

bool HierGroup::staged(const OpDesc& op) const {
  // The kinds whose headers compare the thresholds (net::hierStages).
  if (!local_ || !net::hierStages(op.kind)) return false;
  const uint64_t min = world_->config().hierMinBytes;
  switch (op.kind) {
    case OpKind::kAllreduce:  // every local rank gets a section of at least one element
      return op.bytes() >= min && op.count >= static_cast<size_t>(local_->size());
    case OpKind::kBroadcast:
    case OpKind::kReduce:
      return op.bytes() >= min;
    default:  // allgather, reduce_scatter: by the whole buffer, all ranks' blocks
      return op.bytes() * static_cast<uint64_t>(size()) >= min;
  }
}

std::string HierGroup::stageHead(const char* op, int n, const std::string& where) const {
  return hier::stageHead(op, rank(), world_->opCount(), n, 2, where);
}

void HierGroup::allreduce(const OpDesc& op, const void* in, void* out) {
  // Every rank of a group has the same kind of group: all of them throw here.
  BRAID_ENFORCE(!op.narrowed(), opName(op.kind), rank(), "a group across hosts has no "
                "narrowed allreduce (Note [Allreduce on a narrower wire]); cast first");
  if (!staged(op)) {
    if (local_) return allreduceSmall(op, in, out);
    return net::allreduce(*world_, op, in, out);
  }
  world_->begin(op, net::NetAlgo::kHier);
  allreduceStages(op, in, out);
}

void HierGroup::broadcast(const OpDesc& op, void* buf) {
  if (broadcastRides(op)) return broadcastSmall(op, buf);
  if (!staged(op)) return net::broadcast(*world_, op, buf);
  world_->begin(op, net::NetAlgo::kHier);
  broadcastStages(op, buf);
}

void HierGroup::reduce(const OpDesc& op, const void* in, void* out) {
  if (!staged(op)) return net::reduce(*world_, op, in, out);
  world_->begin(op, net::NetAlgo::kHier);
  reduceStages(op, in, out);
}

void HierGroup::allgather(const OpDesc& op, const void* in, void* const* outs) {
  if (!staged(op)) return net::allgather(*world_, op, in, outs);
  world_->begin(op, net::NetAlgo::kHier);
  allgatherStages(op, in, outs);
}

void HierGroup::gather(const OpDesc& op, const void* in, void* const* outs) {
  net::gather(*world_, op, in, outs);
}
void HierGroup::scatter(const OpDesc& op, const void* const* ins, void* out) {
  net::scatter(*world_, op, ins, out);
}
void HierGroup::reduceScatter(const OpDesc& op, const void* const* ins, void* out) {
  if (!staged(op)) return net::reduceScatter(*world_, op, ins, out);
  world_->begin(op, net::NetAlgo::kHier);
  reduceScatterStages(op, ins, out);
}
void HierGroup::alltoall(const OpDesc& op, const void* const* ins, void* const* outs) {
  net::alltoall(*world_, op, ins, outs);
}
void HierGroup::barrier(const OpDesc& op) { net::barrier(*world_, op); }
void HierGroup::failOp(const OpDesc& op) { net::failOp(*world_, op); }

void HierGroup::markBroken(const std::string& why) {
  world_->markBroken(why);
  if (cross_) cross_->markBroken(why);
  if (local_) local_->markBroken(why);
  // The ranks on other hosts see this rank leave and fail now, not at their
  // deadline (Note [Collectives across hosts]).
  worldT_->abort(why);
  if (crossT_) crossT_->abort(why);
  p2pT_->abort(why);
}

PointToPoint& HierGroup::p2p() {
  std::call_once(p2pOnce_, [this] { p2p_ = std::make_unique<net::NetP2P>(*p2pT_); });
  return *p2p_;
}

void HierGroup::abort() {
  worldT_->abort("the group was shut down");
  if (crossT_) crossT_->abort("the group was shut down");
  if (p2pT_) p2pT_->abort("the group was shut down");
  if (local_) local_->abort();
}

void HierGroup::close() {
  if (p2p_) p2p_->shutdown();
  if (local_) local_->close();
  if (crossT_) crossT_->close();
  if (worldT_) worldT_->close();
  if (p2pT_) p2pT_->close();
}

}  // namespace collectives
}  // namespace braid
