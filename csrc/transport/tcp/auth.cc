#include "transport/tcp/auth.h"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "common/error.h"
#include "common/logging.h"
#include "common/settings.h"

namespace braid {
namespace transport {
namespace tcp {
namespace {

BRAID_SETTING_STRING(kLibcrypto, "BRAID_LIBCRYPTO", "",
                     "Path of the OpenSSL libcrypto (1.1 or 3) that authenticates TCP "
                     "connections; unset: the copy already in the process, else "
                     "libcrypto.so.3, else libcrypto.so.1.1. Note [libcrypto at run time].");

// Newest first: 3.x, then 1.1 (Note [libcrypto at run time]).
constexpr const char* kSonames[] = {"libcrypto.so.3", "libcrypto.so.1.1"};

// libcrypto's functions as OpenSSL 1.1 and 3.x declare them; EVP_MD is opaque.
struct EvpMd;
using EvpSha256Fn = const EvpMd* (*)();
using HmacFn = unsigned char* (*)(const EvpMd* md, const void* key, int keyLen,
                                  const unsigned char* data, size_t n, unsigned char* out,
                                  unsigned int* outLen);
using RandBytesFn = int (*)(unsigned char* buf, int num);
using MemcmpFn = int (*)(const void* a, const void* b, size_t len);
using VersionFn = const char* (*)(int type);

struct Crypto {
  CryptoInfo info;
  EvpSha256Fn evpSha256 = nullptr;
  HmacFn hmac = nullptr;
  RandBytesFn randBytes = nullptr;
  MemcmpFn memcmp = nullptr;
};

std::string loadedPath(void* handle, const std::string& fallback) {
  link_map* lm = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && *lm->l_name) {
    return lm->l_name;
  }
  return fallback;
}

std::string lastDlError() {
  const char* e = dlerror();
  return e ? e : "unknown error";
}

// Never unloaded: function pointers into it may be in use on any thread.
const Crypto* load() {
  auto* c = new Crypto;
  const std::string file = kLibcrypto.get();
  void* h = nullptr;
  std::string name;
  std::vector<std::string> failures;
  if (!file.empty()) {
    h = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h) c->info.how = "BRAID_LIBCRYPTO";
    else failures.push_back(lastDlError());
    name = file;
  } else {
    for (const char* so : kSonames) {  // the process's own copy, if it has one
      h = dlopen(so, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
      if (h) {
        c->info.how = "already loaded in the process";
        name = so;
        break;
      }
    }
    for (const char* so : kSonames) {
      if (h) break;
      h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
      if (h) {
        c->info.how = "dlopen";
        name = so;
      } else {
        failures.push_back(lastDlError());
      }
    }
  }
  if (!h) {
    std::string why;
    for (const auto& f : failures) why += (why.empty() ? "" : "; ") + f;
    c->info.error = strCat(
        "TCP groups need OpenSSL's libcrypto at run time to authenticate their connections, ",
        file.empty() ? "and neither libcrypto.so.3 nor libcrypto.so.1.1 could be loaded ("
                     : "and BRAID_LIBCRYPTO could not be loaded (",
        why,
        "). Install OpenSSL's runtime library (Debian/Ubuntu: libssl3; Fedora/RHEL: "
        "openssl-libs), or set BRAID_LIBCRYPTO to its path; OpenSSL's headers are not needed");
    return c;
  }
  c->info.path = loadedPath(h, name);
  auto sym = [&](const char* s) -> void* {
    void* p = dlsym(h, s);
    if (!p && c->info.error.empty()) {
      c->info.error = strCat(c->info.path, " has no ", s,
                             ": braid needs OpenSSL's libcrypto 1.1 or 3 (Note [libcrypto at run "
                             "time]); set BRAID_LIBCRYPTO to such a file");
    }
    return p;
  };
  c->evpSha256 = reinterpret_cast<EvpSha256Fn>(sym("EVP_sha256"));
  c->hmac = reinterpret_cast<HmacFn>(sym("HMAC"));
  c->randBytes = reinterpret_cast<RandBytesFn>(sym("RAND_bytes"));
  c->memcmp = reinterpret_cast<MemcmpFn>(sym("CRYPTO_memcmp"));
  if (auto version = reinterpret_cast<VersionFn>(dlsym(h, "OpenSSL_version"))) {
    const char* v = version(0);  // OPENSSL_VERSION
    if (v) c->info.version = v;
  }
  c->info.loaded = c->info.error.empty();
  return c;
}

std::mutex gLoadMu;
std::atomic<const Crypto*> gCrypto{nullptr};

const Crypto& crypto() {
  const Crypto* c = gCrypto.load(std::memory_order_acquire);
  if (c) return *c;
  std::lock_guard<std::mutex> lock(gLoadMu);
  c = gCrypto.load(std::memory_order_relaxed);
  if (!c) {
    c = load();
    gCrypto.store(c, std::memory_order_release);
  }
  return *c;
}

// The handshake runs only after requireCrypto() passed; this guards the rest.
const Crypto& loadedCrypto(const char* what) {
  const Crypto& c = crypto();
  if (!c.info.loaded) throw Error(strCat("braid tcp handshake: ", what, ": ", c.info.error));
  return c;
}

void putU32(std::vector<uint8_t>& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

}  // namespace

CryptoInfo cryptoInfo() { return crypto().info; }

void requireCrypto(int rank) {
  const Crypto& c = crypto();
  BRAID_ENFORCE(c.info.loaded, "tcp init", rank, c.info.error);
}

namespace testing {
void reloadCryptoForTesting() {
  std::lock_guard<std::mutex> lock(gLoadMu);
  gCrypto.store(nullptr, std::memory_order_release);  // the old one leaks, by design
}
}  // namespace testing

void hmacSha256(const void* key, size_t keyLen, const uint8_t* data, size_t n,
                uint8_t out[kMacBytes]) {
  const Crypto& c = loadedCrypto("HMAC-SHA256");
  // An empty key still needs a valid pointer.
  static const uint8_t kNoKey = 0;
  if (keyLen == 0) key = &kNoKey;
  unsigned int len = 0;
  if (!c.hmac(c.evpSha256(), key, static_cast<int>(keyLen), data, n, out, &len) ||
      len != kMacBytes) {
    throw Error("braid tcp handshake: HMAC-SHA256 failed");
  }
}

void randomNonce(uint8_t* out, int rank) {
  const Crypto& c = loadedCrypto("RAND_bytes");
  BRAID_ENFORCE(c.randBytes(out, static_cast<int>(kNonceBytes)) == 1, "tcp handshake", rank,
                "RAND_bytes failed to produce a nonce");
}

void computeMac(const std::string& secret, MacRole role, const MacInput& in, uint8_t* out) {
  static const char kDialerLabel[] = "braid-tcp-v1 dialer";
  static const char kAcceptorLabel[] = "braid-tcp-v1 acceptor";
  const char* label = role == MacRole::kDialer ? kDialerLabel : kAcceptorLabel;
  std::vector<uint8_t> msg(label, label + std::char_traits<char>::length(label) + 1);
  putU32(msg, static_cast<uint32_t>(in.group->size()));
  msg.insert(msg.end(), in.group->begin(), in.group->end());
  putU32(msg, in.dialer);
  putU32(msg, in.acceptor);
  putU32(msg, in.index);
  msg.insert(msg.end(), in.nonceDialer, in.nonceDialer + kNonceBytes);
  msg.insert(msg.end(), in.nonceAcceptor, in.nonceAcceptor + kNonceBytes);
  hmacSha256(secret.data(), secret.size(), msg.data(), msg.size(), out);
}

bool macEqual(const uint8_t* a, const uint8_t* b) {
  return loadedCrypto("CRYPTO_memcmp").memcmp(a, b, kMacBytes) == 0;
}

void warnUnauthenticatedOnce(int rank) {
  static std::once_flag once;
  std::call_once(once, [&] {
    BRAID_LOG(kWarn, "tcp", rank)
        << "TCP connections are NOT authenticated: neither BRAID_SECRET_FILE nor BRAID_SECRET is "
           "set, so anyone who can reach this job's ports can inject data. Set the same secret "
           "on every rank (and BRAID_REQUIRE_AUTH=1 to insist on it).";
  });
}

}  // namespace tcp
}  // namespace transport
}  // namespace braid
