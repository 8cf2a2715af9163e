// The rendezvous store as the transport sees it: a small key-value service
// shared by the ranks of a group (c10d's Store in the backend, an in-process
// map in the C++ tests).
#pragma once

#include <chrono>
#include <cstdint>
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

}  // namespace transport
}  // namespace braid
