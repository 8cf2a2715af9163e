// An in-process Store and a runner that executes one function per rank on
// threads, for testing transport and collectives without torch or processes.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "transport/store.h"

namespace braid {
namespace testing {

class MemoryStore : public transport::Store {
 public:
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    kv_[key] = value;
    cv_.notify_all();
  }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return kv_.count(key) > 0; })) {
      throw TimeoutError("MemoryStore: timed out waiting for key " + key);
    }
    return kv_[key];
  }
  int64_t add(const std::string& key, int64_t delta) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto& v = kv_[key];
    int64_t x = 0;
    if (!v.empty()) x = std::stoll(std::string(v.begin(), v.end()));
    x += delta;
    std::string s = std::to_string(x);
    v.assign(s.begin(), s.end());
    cv_.notify_all();
    return x;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<uint8_t>> kv_;
};

// Runs fn(rank) on `size` threads; rethrows the first exception.
inline void runRanks(int size, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(size);
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace testing
}  // namespace braid
