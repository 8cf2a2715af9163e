#include "transport/tcp/options.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/logging.h"
#include "common/settings.h"
#include "transport/tcp/socket.h"

namespace braid {
namespace transport {
namespace tcp {

BRAID_SETTING_INT(kSocketsPerPeer, "BRAID_TCP_SOCKETS_PER_PEER", 2,
                  "TCP sockets between each pair of ranks on different hosts (1..64); large "
                  "messages are striped over them. Must be equal on every rank.");
BRAID_SETTING_STRING(kConnect, "BRAID_TCP_CONNECT", "",
                     "When TCP connections are made: eager (all at group creation) or lazy (on "
                     "a pair's first message); unset: eager up to 64 ranks, else lazy.");
BRAID_SETTING_INT(kChunkBytes, "BRAID_TCP_CHUNK_BYTES", 512 << 10,
                  "Bytes per TCP frame of a large message (>= 64 KiB); the sockets of a pair "
                  "take chunks as they become free.");
BRAID_SETTING_INT(kUnexpectedBytes, "BRAID_TCP_UNEXPECTED_BYTES", 64 << 20,
                  "Bytes a rank buffers for TCP messages whose receive is not posted yet; past "
                  "that, the sender's sockets wait until a receive is posted.");
BRAID_SETTING_STRING(kIfname, "BRAID_SOCKET_IFNAME", "",
                     "Network interface whose address TCP listens on, in NCCL_SOCKET_IFNAME's "
                     "syntax: eth (any eth*), =eth0 (exactly), eth0,ib0 (the first that "
                     "exists), ^docker,lo (any but those); unset: GLOO_SOCKET_IFNAME's names, "
                     "else the address that routes to the store's host.");
BRAID_SETTING_STRING(kCongestion, "BRAID_TCP_CONGESTION", "",
                     "TCP congestion control for braid's sockets (e.g. cubic, reno, bbr: one "
                     "that /proc/sys/net/ipv4/tcp_allowed_congestion_control lists); unset: the "
                     "system's. Note [Congestion control].");
BRAID_SETTING_SECRET(kSecret, "BRAID_SECRET",
                     "Per-job secret that authenticates every TCP connection (HMAC-SHA256); "
                     "never sent, never stored in the store. Prefer BRAID_SECRET_FILE.");
BRAID_SETTING_STRING(kSecretFile, "BRAID_SECRET_FILE", "",
                     "File holding the per-job secret (trailing newline ignored); used when "
                     "BRAID_SECRET is unset.");
BRAID_SETTING_BOOL(kRequireAuth, "BRAID_REQUIRE_AUTH", false,
                   "1: refuse to create a TCP group without a secret (BRAID_SECRET or "
                   "BRAID_SECRET_FILE).");
BRAID_SETTING_INT(kTimeoutMs, "BRAID_TCP_CONNECT_TIMEOUT_MS", 30000,
                  "Milliseconds to connect a TCP group (or a pair, lazily) and to finish any "
                  "one handshake.");

namespace {

// A secret that other users of the machine can read authenticates nothing
// against them (ssh refuses such keys). braid warns rather than refuses: a
// file shared with a group on purpose is the user's call. Once per file.
void warnIfOthersCanRead(const std::string& path, int rank) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || (st.st_mode & (S_IRWXG | S_IRWXO)) == 0) return;
  static std::mutex mu;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lock(mu);
  if (!warned.insert(path).second) return;
  char mode[8];
  std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
  BRAID_LOG(kWarn, "tcp", rank) << "BRAID_SECRET_FILE '" << path << "' has mode " << mode
                                << ": other users can read it and so join or spoof this job; "
                                   "chmod 600 it";
}

std::string readSecretFile(const std::string& path, int rank) {
  std::ifstream f(path, std::ios::binary);
  BRAID_ENFORCE(f.good(), "tcp init", rank, "cannot read BRAID_SECRET_FILE '", path, "'");
  std::ostringstream os;
  os << f.rdbuf();
  std::string s = os.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  BRAID_ENFORCE(!s.empty(), "tcp init", rank, "BRAID_SECRET_FILE '", path, "' is empty");
  warnIfOthersCanRead(path, rank);
  return s;
}

}  // namespace

TcpOptions TcpOptions::fromEnv(int rank, int size) {
  TcpOptions o;
  o.socketsPerPeer = static_cast<int>(kSocketsPerPeer.get());
  std::string mode = kConnect.get();
  if (mode.empty()) {
    o.connect = size <= 64 ? ConnectMode::kEager : ConnectMode::kLazy;
  } else if (mode == "eager" || mode == "lazy") {
    o.connect = mode == "eager" ? ConnectMode::kEager : ConnectMode::kLazy;
  } else {
    BRAID_THROW(Error, "tcp init", rank, "BRAID_TCP_CONNECT must be eager or lazy, got '", mode,
                "'");
  }
  int64_t chunk = kChunkBytes.get(), unexpected = kUnexpectedBytes.get(), ms = kTimeoutMs.get();
  BRAID_ENFORCE(chunk > 0 && unexpected >= 0 && ms > 0, "tcp init", rank,
                "BRAID_TCP_CHUNK_BYTES (", chunk, "), BRAID_TCP_UNEXPECTED_BYTES (", unexpected,
                ") and BRAID_TCP_CONNECT_TIMEOUT_MS (", ms, ") must be positive");
  o.chunkBytes = static_cast<size_t>(chunk);
  o.maxUnexpectedBytes = static_cast<size_t>(unexpected);
  o.timeout = std::chrono::milliseconds(ms);
  o.ifname = kIfname.get();
  // gloo's setting, when braid's is unset (Note [Choosing the interface]).
  const char* gloo = std::getenv("GLOO_SOCKET_IFNAME");
  if (o.ifname.empty() && gloo && *gloo) {
    o.ifname = gloo;
    o.ifnameSyntax = IfnameSyntax::kGloo;
  }
  o.congestion = kCongestion.get();
  o.secret = kSecret.get();
  std::string file = kSecretFile.get();
  if (o.secret.empty() && !file.empty()) o.secret = readSecretFile(file, rank);
  o.requireAuth = kRequireAuth.get();
  o.check(rank);
  return o;
}

void TcpOptions::check(int rank) const {
  BRAID_ENFORCE(socketsPerPeer >= 1 && socketsPerPeer <= 64, "tcp init", rank,
                "BRAID_TCP_SOCKETS_PER_PEER must be in 1..64, got ", socketsPerPeer);
  BRAID_ENFORCE(chunkBytes >= (64 << 10) && chunkBytes <= (1u << 30), "tcp init", rank,
                "BRAID_TCP_CHUNK_BYTES must be in 64 KiB..1 GiB, got ", chunkBytes);
  BRAID_ENFORCE(!requireAuth || !secret.empty(), "tcp init", rank,
                "BRAID_REQUIRE_AUTH=1 but no secret is set: set BRAID_SECRET_FILE (or "
                "BRAID_SECRET) to the same per-job secret on every rank");
  BRAID_ENFORCE(timeout.count() > 0, "tcp init", rank, "timeout must be positive, got ",
                timeout.count(), " ms");
  checkCongestion(congestion, rank);
}

}  // namespace tcp
}  // namespace transport
}  // namespace braid
