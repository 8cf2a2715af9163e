// The rendezvous store as the transport sees it: a small key-value service
// shared by the ranks of a group (c10d's Store in the backend, an in-process
// map in the C++ tests).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace braid {
namespace transport {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // Blocks until the key exists or the timeout passes (then throws braid::TimeoutError).
  virtual std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
};

// Every rank of a group publishes `mine` under key(rank) and reads every
// rank's value by `deadline`: an allgather of small strings through the store
// (host identities, listening addresses). Returns the values by rank, with
// `missing` empty; when the deadline passes first, `missing` lists the ranks
// that published nothing, as "2,3" (for the caller's own error), and the
// values are not returned.
// Another Store's keys under `prefix` (a sub-group's rendezvous).
class PrefixedStore : public Store {
 public:
  PrefixedStore(Store& base, std::string prefix) : base_(base), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    base_.set(prefix_ + key, value);
  }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    return base_.get(prefix_ + key, timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    return base_.add(prefix_ + key, delta);
  }

 private:
  Store& base_;
  const std::string prefix_;
};

std::vector<std::string> exchangeThroughStore(Store& store,
                                              const std::function<std::string(int)>& key,
                                              int rank, int size, const std::string& mine,
                                              std::chrono::steady_clock::time_point deadline,
                                              std::string* missing);

}  // namespace transport
}  // namespace braid
