// Note [Shared regions] in shared_region.h.
#include "transport/shm/shared_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "common/error.h"

namespace braid {
namespace transport {
namespace shm {
namespace {

constexpr size_t kHeader = 64;  // the nonce, then padding: data stays 64-byte aligned
constexpr uint32_t kMagic = 0x6d697362;  // "bsim": the simulated device's handles came first

struct Handle {  // kRegionHandleBytes at most
  uint32_t magic;
  int32_t pid;
  int32_t fd;
  uint32_t pad;
  uint64_t bytes;
  uint64_t nonce;
};
static_assert(sizeof(Handle) <= kRegionHandleBytes, "a handle fits its bytes");

uint64_t randomNonce() {
  static thread_local std::mt19937_64 gen(std::random_device{}() ^
                                          (static_cast<uint64_t>(getpid()) << 32));
  uint64_t n = 0;
  while (n == 0) n = gen();
  return n;
}


}  // namespace

std::shared_ptr<SharedRegion> SharedRegion::create(size_t bytes, const char* call) {
  std::shared_ptr<SharedRegion> r(new SharedRegion());
  r->bytes_ = bytes;
  r->mapped_ = kHeader + (bytes > 0 ? bytes : 1);
  r->fd_ = memfd_create("braid-shared", MFD_CLOEXEC);
  if (r->fd_ < 0) throw Error(strCat("braid: ", call, ": memfd_create: ", std::strerror(errno)));
  if (ftruncate(r->fd_, static_cast<off_t>(r->mapped_)) != 0) {
    throw Error(strCat("braid: ", call, "(", bytes, " bytes): ftruncate: ", std::strerror(errno)));
  }
  r->base_ = mmap(nullptr, r->mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd_, 0);
  if (r->base_ == MAP_FAILED) {
    r->base_ = nullptr;
    throw Error(strCat("braid: ", call, "(", bytes, " bytes): mmap: ", std::strerror(errno)));
  }
  r->data_ = static_cast<char*>(r->base_) + kHeader;
  r->pid_ = getpid();
  r->exportFd_ = r->fd_;
  r->nonce_ = randomNonce();
  std::memcpy(r->base_, &r->nonce_, sizeof(r->nonce_));
  return r;
}

std::shared_ptr<SharedRegion> SharedRegion::open(const std::string& handle, const char* call) {
  Handle h{};
  if (handle.size() != kRegionHandleBytes) {
    throw Error(strCat("braid: ", call, ": a handle of ", handle.size(), " bytes, expected ",
                       kRegionHandleBytes));
  }
  std::memcpy(&h, handle.data(), sizeof(h));
  if (h.magic != kMagic) throw Error(strCat("braid: ", call, ": not a shared-region handle"));
  const std::string path = strCat("/proc/", h.pid, "/fd/", h.fd);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    throw Error(strCat("braid: ", call, ": cannot open ", path, " (", std::strerror(errno),
                       "): the exporting process (pid ", h.pid, ") has exited or freed it"));
  }
  std::shared_ptr<SharedRegion> r(new SharedRegion());
  r->bytes_ = h.bytes;
  r->mapped_ = kHeader + (h.bytes > 0 ? h.bytes : 1);
  r->base_ = mmap(nullptr, r->mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the pages
  if (r->base_ == MAP_FAILED) {
    r->base_ = nullptr;
    throw Error(strCat("braid: ", call, ": mmap of ", path, ": ", std::strerror(err)));
  }
  uint64_t nonce = 0;
  std::memcpy(&nonce, r->base_, sizeof(nonce));
  if (nonce != h.nonce) {
    throw Error(strCat("braid: ", call, ": ", path, " is not the memory this handle named (pid ",
                       h.pid, " freed it and reused the descriptor)"));
  }
  r->data_ = static_cast<char*>(r->base_) + kHeader;
  r->pid_ = h.pid;
  r->exportFd_ = h.fd;
  r->nonce_ = h.nonce;
  return r;
}

SharedRegion::~SharedRegion() {
  if (base_ != nullptr) munmap(base_, mapped_);
  if (fd_ >= 0) ::close(fd_);
}

std::string SharedRegion::handle() const {
  Handle h{kMagic, static_cast<int32_t>(pid_), exportFd_, 0, bytes_, nonce_};
  std::string out(kRegionHandleBytes, '\0');
  std::memcpy(&out[0], &h, sizeof(h));
  return out;
}

}  // namespace shm
}  // namespace transport
}  // namespace braid
