// The shared-memory implementation of transport::Transport: tagged messages
// between the processes of one host over a ShmWindow's byte channels,
// progressed by a P2PEngine (p2p_engine.h, Note [Point-to-point progress]).
// It keeps the contract of transport.h, as tcp::TcpTransport does, so the
// message algorithms of collectives/net and their tests run over either.
// Groups on one host still take the slot-based collectives of
// collectives/shm: they reduce in place in shared memory, with no message
// framing, and are much faster than messages through a byte ring.
//
// What differs from TCP, within the contract:
// - Unexpected messages are buffered without a budget (the P2PEngine's rule):
//   the sender's bytes are copied out of the ring as they arrive.
// - abort() from inside a completion callback (on the engine's own thread)
//   refuses later ops and tells the peers this rank left at once, but fails
//   the pending ones only when close() runs: the engine's thread cannot be
//   stopped from within itself.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "transport/shm/p2p_engine.h"
#include "transport/shm/window.h"
#include "transport/store.h"
#include "transport/transport.h"

namespace braid {
namespace transport {
namespace shm {

// Collective: every rank of the group calls it with the same store. Throws
// braid::Error naming the rank when the window cannot be made.
std::unique_ptr<Transport> connect(Store& store, int rank, int size, const WindowOptions& options);

class ShmTransport : public Transport {
 public:
  // Errors say this rank is `logRank` (-1: its rank in the window); messages
  // of at least `directMin` bytes are read in place (WindowOptions::directMin).
  explicit ShmTransport(std::unique_ptr<ShmWindow> window, int logRank = -1,
                        size_t directMin = 0);
  ~ShmTransport() override;

  int rank() const override { return window_->rank(); }
  int size() const override { return window_->size(); }
  std::shared_ptr<Request> isend(int dst, uint64_t tag, const void* data, size_t bytes,
                                 Request::Callback done) override;
  std::shared_ptr<Request> irecv(int src, uint64_t tag, void* data, size_t bytes,
                                 Request::Callback done) override;
  std::string peerName(int rank) const override;
  void abort(const std::string& why) override;
  void close() override;

 private:
  void checkArgs(const char* op, int peer, const void* data, size_t bytes) const;
  // Posts through `post` unless the transport is aborted or closed; an
  // engine that refuses (it stopped meanwhile) fails the request instead.
  template <typename Post>
  std::shared_ptr<Request> submit(std::string what, Request::Callback done, Post post);
  P2PEngine::Done finisher(const std::shared_ptr<Request>& req);

  std::unique_ptr<ShmWindow> window_;
  const int logRank_;
  std::unique_ptr<P2PEngine> engine_;
  std::mutex mu_;
  bool aborted_ = false, closed_ = false;
  std::string abortWhy_;
};

}  // namespace shm
}  // namespace transport
}  // namespace braid
