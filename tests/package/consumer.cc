// Links against the installed package and runs a one-rank allreduce.
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <iostream>

#include "c10d/process_group.h"

int main() {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto pg = braid::createProcessGroup(store, 0, 1, std::chrono::seconds(30));
  std::vector<at::Tensor> t{at::arange(4, at::kFloat)};
  pg->allreduce(t)->wait();
  if (t[0][3].item<float>() != 3.0f) {
    std::cerr << "consumer: wrong allreduce result\n";
    return 1;
  }
  std::cout << "consumer: find_package(Braid) + braid::braid OK\n";
  return 0;
}
