#include "transport/tcp/transport.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/logging.h"
#include "common/thread_name.h"

namespace braid {
namespace transport {
namespace tcp {
namespace {

std::string addrKey(const std::string& group, int rank) {
  return "braid/tcp/" + group + "/addr/" + std::to_string(rank);
}

// Note [A rank that cannot connect]
// A rank whose TCP start fails (no usable interface, a peer it cannot dial,
// a handshake refused) raises at once, but its peers would go on waiting for
// its address or its sockets until the group's timeout (30 minutes by
// default): a hang, as its users see it. So it says why in the store: its
// address key becomes "!" and the reason (peers still reading addresses fail
// as they read it), and it counts itself among the group's failures and
// files its reason under its number (peers waiting for their sockets look
// every 100 ms, and quote the first). Each peer then fails with its own
// error, quoting the rank's.
//
// A peer that fails only because it read such a report files nothing: its
// own "!" would be a second report of the same cause, and a third rank
// reading addresses in order could quote it ("rank 0 could not connect:
// rank 1 could not connect: ...") instead of the rank that failed. Its real
// address stays published; ranks that read it still find the first report
// before they dial, or while they wait for their sockets.
constexpr auto kFailurePoll = std::chrono::milliseconds(100);
// How long an acceptor waits for its own refusal of a peer that reported it
// could not connect, before failing without it (waitConnected).
constexpr auto kRefusalGrace = std::chrono::seconds(1);

std::string failedKey(const std::string& group) { return "braid/tcp/" + group + "/failed"; }
// The reason of the n-th rank to fail (from 1): waiters quote the first, the
// cause, not a later one that only passes it on.
std::string whyKey(const std::string& group, int64_t n) {
  return "braid/tcp/" + group + "/failed-why/" + std::to_string(n);
}

void sayWhyInTheStore(Store& store, const std::string& group, int rank, const std::string& why) {
  try {
    std::string text = "!" + why;
    store.set(addrKey(group, rank), {text.begin(), text.end()});
    const int64_t n = store.add(failedKey(group), 1);
    store.set(whyKey(group, n), {why.begin(), why.end()});
  } catch (const std::exception&) {
    // The store is gone too: the peers will learn from their own timeouts.
  }
}

}  // namespace

std::unique_ptr<Transport> connect(Store& store, int rank, int size, const TcpOptions& options) {
  BRAID_ENFORCE(size >= 1 && rank >= 0 && rank < size, "tcp connect", rank, "rank ", rank,
                " is not in a group of ", size);
  options.check(rank);
  if (options.secret.empty()) warnUnauthenticatedOnce(options.logRankOr(rank));
  auto t = std::make_unique<TcpTransport>(rank, size, options);
  try {
    t->start(store);
  } catch (const std::exception& e) {
    t->close();
    if (!t->failedOnAPeersReport()) {  // Note [A rank that cannot connect]
      sayWhyInTheStore(store, options.groupId, rank, e.what());
    }
    throw;
  }
  return t;
}

TcpTransport::TcpTransport(int rank, int size, const TcpOptions& options)
    : rank_(rank), size_(size), logRank_(options.logRankOr(rank)), opt_(options) {
  id_.group = opt_.groupId;
  id_.secret = opt_.secret;
  id_.rank = rank;
  id_.size = size;
  id_.socketsPerPeer = opt_.socketsPerPeer;
  shared_.rank = rank;
  shared_.chunkBytes = opt_.chunkBytes;
  shared_.maxUnexpected = opt_.maxUnexpectedBytes;
  for (int p = 0; p < size; ++p) {
    pairs_.push_back(std::make_unique<Pair>(shared_, p, p == rank ? 0 : opt_.socketsPerPeer));
  }
}

TcpTransport::~TcpTransport() { close(); }

void TcpTransport::start(Store& store) {
  // Before listening, and inside connect()'s report: peers quote what is missing.
  requireCrypto(logRank_);  // Note [libcrypto at run time]
  const auto deadline = Clock::now() + opt_.timeout;
  SockAddr bound;
  const std::string host = chooseHost(opt_.ifname, opt_.ifnameSyntax, opt_.storeHost,
                                       opt_.acrossHosts, logRank_);
  listenFd_ = listenOn(host, rank_, &bound);
  epollFd_ = epoll_create1(EPOLL_CLOEXEC);
  wakeFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  BRAID_ENFORCE(epollFd_ >= 0 && wakeFd_ >= 0, "tcp connect", rank_, "epoll/eventfd: ",
                std::strerror(errno));
  const int fds[] = {listenFd_, wakeFd_};
  Conn* tags[] = {&listenTag_, &wakeTag_};
  for (int i = 0; i < 2; ++i) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = tags[i];
    BRAID_ENFORCE(epoll_ctl(epollFd_, EPOLL_CTL_ADD, fds[i], &ev) == 0, "tcp connect", rank_,
                  "epoll_ctl: ", std::strerror(errno));
  }
  const std::string me = bound.str();
  std::string missing;
  addrs_ = exchangeThroughStore(
      store, [this](int r) { return addrKey(opt_.groupId, r); }, rank_, size_, me, deadline,
      &missing);
  if (!missing.empty()) {
    BRAID_THROW(TimeoutError, "tcp connect", rank_, "rank",
                missing.find(',') == std::string::npos ? " " : "s ", missing,
                " published no address within ", opt_.timeout.count(), " ms");
  }
  for (int p = 0; p < size_; ++p) {  // Note [A rank that cannot connect]
    if (p == rank_ || addrs_[p].empty() || addrs_[p][0] != '!') continue;
    const std::string why = addrs_[p].substr(1);
    addrs_.clear();  // peerName must not quote the reason as an address
    failedOnAPeersReport_ = true;
    BRAID_THROW(PeerLostError, "tcp connect", logRank_, peerName(p),
                " could not connect: ", why);
  }
  BRAID_LOG(kInfo, "tcp", logRank_)
      << "group " << opt_.groupId << " (rank " << rank_ << " of " << size_ << "): listening on "
      << me << " ("
      << (opt_.ifname.empty() ? std::string("the route to the store's host")
                              : ifnameChoice(opt_.ifnameSyntax, opt_.ifname))
      << "), " << opt_.socketsPerPeer << " sockets per peer, "
      << (opt_.connect == ConnectMode::kEager ? "eager" : "lazy");
  thread_ = std::thread([this] { loop(); });
  named(thread_, "braid-tcp");
  if (opt_.connect == ConnectMode::kEager) waitConnected(store, deadline);
}

void TcpTransport::waitConnected(Store& store, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  auto settled = [&] { return connected_ || !connectError_.empty(); };
  bool done = false;
  std::string peerWhy;  // Note [A rank that cannot connect]
  while (!done && peerWhy.empty() && Clock::now() < deadline) {
    done = cv_.wait_until(lock, std::min(deadline, Clock::now() + kFailurePoll), settled);
    if (done) break;
    lock.unlock();
    try {
      if (store.add(failedKey(opt_.groupId), 0) > 0) {
        auto v = store.get(whyKey(opt_.groupId, 1), std::chrono::seconds(1));
        peerWhy.assign(v.begin(), v.end());
      }
    } catch (const std::exception&) {
      // The store is unreachable: the deadline still ends the wait.
    }
    lock.lock();
  }
  // A peer's report can reach the store before this rank's progress thread has
  // finished refusing that peer's dial (seen under load): give the refusal a
  // moment, as it is what says why, when none is recorded yet.
  if (!peerWhy.empty() && rejections_.empty()) {
    cv_.wait_until(lock, std::min(deadline, Clock::now() + kRefusalGrace),
                   [&] { return !rejections_.empty(); });
  }
  // The connections this rank refused go with either failure: when ranks of
  // two hosts have different secrets, an acceptor's own failure is often a
  // peer of its host that gave up first ("closed its connections"), and the
  // refusals are what says why.
  std::string refused;
  for (const auto& r : rejections_) refused += "; " + r;
  if (!connectError_.empty()) throw PeerLostError(connectError_ + refused);
  if (done) return;
  if (!peerWhy.empty()) {
    failedOnAPeersReport_ = true;
    throw PeerLostError(strCat("braid tcp connect (rank ", logRank_,
                               "): a peer could not connect: ", peerWhy, refused));
  }
  throw TimeoutError(strCat("braid tcp connect (rank ", rank_, "): timed out after ",
                            opt_.timeout.count(), " ms waiting for every peer's sockets (not "
                            "connected: ", notConnected_, ")", refused));
}

std::string TcpTransport::peerName(int p) const {
  if (p < 0 || p >= size_) return strCat("rank ", p);
  std::string who = p < static_cast<int>(opt_.peerNames.size()) ? opt_.peerNames[p]
                                                                 : strCat("rank ", p);
  return strCat(who, p < static_cast<int>(addrs_.size()) ? " at " + addrs_[p] : "");
}

void TcpTransport::checkArgs(const char* op, int peer, const void* data, size_t bytes) const {
  BRAID_ENFORCE(peer >= 0 && peer < size_, op, rank_, "peer rank ", peer,
                " is not in the group of ", size_);
  BRAID_ENFORCE(!opt_.skips(peer), op, rank_, peerName(peer),
                " is reached through shared memory, not through this TCP transport");
  BRAID_ENFORCE(data || bytes == 0, op, rank_, "null buffer for ", bytes, " bytes");
  BRAID_ENFORCE(bytes <= kMaxMessageBytes, op, rank_, bytes, " bytes exceed the largest message, ",
                kMaxMessageBytes);
}

std::shared_ptr<Request> TcpTransport::isend(int dst, uint64_t tag, const void* data, size_t bytes,
                                             Request::Callback done) {
  checkArgs("tcp send", dst, data, bytes);
  auto req = std::make_shared<Request>(
      errorText("tcp send", rank_, "to ", peerName(dst), ", tag ", tag, ", ", bytes, " bytes"),
      std::move(done));
  req->setDriver(this);
  auto s = std::make_shared<SendOp>(SendOp{req, static_cast<const uint8_t*>(data), bytes, tag});
  post(Post{std::move(s), nullptr, dst}, req);
  return req;
}

std::shared_ptr<Request> TcpTransport::irecv(int src, uint64_t tag, void* data, size_t bytes,
                                             Request::Callback done) {
  checkArgs("tcp recv", src, data, bytes);
  auto req = std::make_shared<Request>(
      errorText("tcp recv", rank_, "from ", peerName(src), ", tag ", tag, ", ", bytes, " bytes"),
      std::move(done));
  req->setDriver(this);
  auto r = std::make_shared<RecvOp>(RecvOp{req, static_cast<uint8_t*>(data), bytes, tag});
  post(Post{nullptr, std::move(r), src}, req);
  return req;
}

thread_local const TcpTransport* TcpTransport::Progressing::current = nullptr;

void TcpTransport::post(Post p, const std::shared_ptr<Request>& req) {
  std::string refused;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_ || closing_) {
      refused = aborted_ ? "aborted: " + abortWhy_ : std::string("the transport is closed");
    } else {
      wake = inbox_.empty();
      inbox_.emplace_back(std::move(p), req);
    }
  }
  if (!refused.empty()) {
    req->complete(std::make_exception_ptr(Error(req->what() + ": " + refused)));
    return;
  }
  // Note [Posting threads progress]. Without the lock the progress thread
  // may be past its adoptPosts already: then only the wake gets it there.
  if (Progressing::current != this && ioMu_.try_lock()) {
    adoptPostsHere(std::unique_lock<std::mutex>(ioMu_, std::adopt_lock));
  } else if (wake) {
    wakeProgress();
  }
}

void TcpTransport::adoptPostsHere(std::unique_lock<std::mutex> io) {
  DeferredCompletions done;
  DeferredCallbacks callbacks;
  bool leftWork;
  {
    Progressing mark(this);
    adoptPosts();
    leftWork = !graveyard_.empty() || !pending_.empty() || shared_.memoryFreed;
  }
  io.unlock();
  done.run();  // Note [Completing after the lock]; the callbacks queue in `callbacks`
  if (keepForProgress(callbacks)) leftWork = true;
  if (leftWork) wakeProgress();
}

bool TcpTransport::keepForProgress(DeferredCallbacks& callbacks) {
  if (callbacks.empty()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& c : callbacks.take()) deferred_.push_back(std::move(c));
  return true;
}

size_t TcpTransport::unexpectedBytes() {
  std::lock_guard<std::mutex> io(ioMu_);
  return shared_.unexpectedBytes;
}

void TcpTransport::wakeProgress() {
  uint64_t one = 1;
  (void)!::write(wakeFd_, &one, sizeof(one));
}

void TcpTransport::runDeferred() {
  std::vector<DeferredCallbacks::Call> calls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    calls.swap(deferred_);
  }
  for (auto& [cb, error] : calls) cb(error);
}

void TcpTransport::abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_ || closed_) return;
  aborted_ = true;
  abortWhy_ = why;
  if (wakeFd_ >= 0) wakeProgress();
}

void TcpTransport::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closing_ = true;
    parkCv_.notify_all();  // a parked progress thread (Note [Waiters drive the sockets])
    if (wakeFd_ >= 0) wakeProgress();
  }
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard<std::mutex> io(ioMu_);
    teardown("the transport is closed");  // when the thread never ran
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (int* fd : {&listenFd_, &epollFd_, &wakeFd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
  closed_ = true;
}

}  // namespace tcp
}  // namespace transport
}  // namespace braid
