// The TCP handshake's cryptography, loaded at run time (Note [libcrypto at
// run time] in transport/tcp/auth.h): HMAC-SHA256 against RFC 4231's test
// vectors, where the library came from, and a process without libcrypto
// (BRAID_LIBCRYPTO naming a file that is missing, or one that is not
// libcrypto): a TCP group then fails at init naming what is missing, with a
// secret or without one, and works again once the library loads.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "common/error.h"
#include "transport/tcp/auth.h"

#include "tcp_group.h"

namespace braid {
namespace {

using transport::tcp::cryptoInfo;
using transport::tcp::hmacSha256;
using transport::tcp::kMacBytes;

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

std::string hex(const uint8_t* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += d[p[i] >> 4];
    s += d[p[i] & 15];
  }
  return s;
}

std::string hmacHex(const std::string& key, const std::string& data) {
  uint8_t out[kMacBytes];
  hmacSha256(key.data(), key.size(), reinterpret_cast<const uint8_t*>(data.data()), data.size(),
             out);
  return hex(out, kMacBytes);
}

// Sets BRAID_LIBCRYPTO for one test and reloads; restores both after it.
class LibcryptoOverride {
 public:
  explicit LibcryptoOverride(const char* path) {
    ::setenv("BRAID_LIBCRYPTO", path, 1);
    transport::tcp::testing::reloadCryptoForTesting();
  }
  ~LibcryptoOverride() {
    ::unsetenv("BRAID_LIBCRYPTO");
    transport::tcp::testing::reloadCryptoForTesting();
  }
};

// Each rank's error from connecting a group ("" where it connected).
std::vector<std::string> connectErrors(int size, const std::string& secret) {
  testing::MemoryStore store;
  auto o = testing::tcpOptions("crypto");
  o.secret = secret;
  o.timeout = std::chrono::milliseconds(3000);
  std::vector<std::string> errors(size);
  std::vector<std::unique_ptr<transport::Transport>> ts(size);  // closed once all are done
  testing::runRanks(size, [&](int r) {
    try {
      ts[r] = transport::tcp::connect(store, r, size, o);
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  return errors;
}

TEST(Crypto, HmacSha256MatchesRfc4231) {
  // RFC 4231, test cases 1, 2 and 6 (a key longer than SHA-256's block).
  EXPECT_EQ(hmacHex(std::string(20, '\x0b'), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hmacHex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hmacHex(std::string(131, '\xaa'),
                    "Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  // An empty key (a group without a secret) is a valid HMAC key: the MAC
  // under an all-zero block, which is what a zero-length key pads to.
  EXPECT_EQ(hmacHex("", "Hi There"), hmacHex(std::string(1, '\0'), "Hi There"));
}

TEST(Crypto, SaysWhichLibcryptoItLoaded) {
  auto info = cryptoInfo();
  ASSERT_TRUE(info.loaded) << info.error;
  EXPECT_TRUE(info.error.empty()) << info.error;
  EXPECT_HAS(info.path, "libcrypto.so");
  EXPECT_FALSE(info.how.empty());
  EXPECT_HAS(info.version, "OpenSSL");
  uint8_t a[transport::tcp::kNonceBytes] = {}, b[transport::tcp::kNonceBytes] = {};
  transport::tcp::randomNonce(a, 0);
  transport::tcp::randomNonce(b, 0);
  EXPECT_NE(hex(a, sizeof(a)), hex(b, sizeof(b)));
  uint8_t m1[kMacBytes] = {1}, m2[kMacBytes] = {1};
  EXPECT_TRUE(transport::tcp::macEqual(m1, m2));
  m2[31] = 2;
  EXPECT_FALSE(transport::tcp::macEqual(m1, m2));
}

TEST(Crypto, PrefersTheCopyAlreadyInTheProcess) {
  // The first load (above, or here) dlopened a soname; a second load finds it
  // in the process.
  cryptoInfo();
  transport::tcp::testing::reloadCryptoForTesting();
  auto info = cryptoInfo();
  ASSERT_TRUE(info.loaded) << info.error;
  EXPECT_EQ(info.how, "already loaded in the process");
}

TEST(Crypto, WithoutLibcryptoATcpGroupFailsNamingWhatIsMissing) {
  {
    LibcryptoOverride none("/nonexistent/libcrypto.so.3");
    auto info = cryptoInfo();
    EXPECT_FALSE(info.loaded);
    EXPECT_HAS(info.error, "/nonexistent/libcrypto.so.3");
    // With a secret and without one: no unauthenticated fallback.
    for (const std::string secret : {"test-secret-0123456789", ""}) {
      auto errors = connectErrors(2, secret);
      for (int r = 0; r < 2; ++r) {
        SCOPED_TRACE("rank " + std::to_string(r) + (secret.empty() ? ", no secret" : ""));
        EXPECT_HAS(errors[r], "libcrypto");
        EXPECT_HAS(errors[r], "BRAID_LIBCRYPTO");
        EXPECT_HAS(errors[r], "/nonexistent/libcrypto.so.3");
        EXPECT_HAS(errors[r], "libssl3");
      }
      EXPECT_HAS(errors[0], "braid tcp init (rank 0)");
    }
    uint8_t out[kMacBytes];
    EXPECT_THROW(hmacSha256("k", 1, out, 0, out), Error);
    EXPECT_THROW(transport::tcp::randomNonce(out, 0), Error);
  }
  {
    // A library that is not libcrypto: named, with the function it lacks.
    LibcryptoOverride wrong("libm.so.6");
    auto info = cryptoInfo();
    EXPECT_FALSE(info.loaded);
    EXPECT_HAS(info.error, "libm.so.6");
    EXPECT_HAS(info.error, "has no EVP_sha256");
    auto errors = connectErrors(1, "s");
    EXPECT_HAS(errors[0], "has no EVP_sha256");
  }
  // The library loads again: groups connect.
  ASSERT_TRUE(cryptoInfo().loaded) << cryptoInfo().error;
  auto errors = connectErrors(2, "test-secret-0123456789");
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

}  // namespace
}  // namespace braid
