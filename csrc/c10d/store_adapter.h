// c10d::Store as the transport's Store.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "common/error.h"
#include "transport/store.h"

namespace braid {

class StoreAdapter : public transport::Store {
 public:
  StoreAdapter(c10::intrusive_ptr<c10d::Store> store, std::string prefix = "")
      : store_(std::move(store)), prefix_(std::move(prefix)) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    store_->set(prefix_ + key, value);
  }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    try {
      store_->wait({prefix_ + key}, timeout);
    } catch (const std::exception& e) {
      throw TimeoutError(strCat("braid init: store key ", key, " did not appear within ",
                                timeout.count(), " ms (", e.what(), ")"));
    }
    return store_->get(prefix_ + key);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    return store_->add(prefix_ + key, delta);
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
};

}  // namespace braid
