#include "cuda/kernel_images.h"

#include <algorithm>
#include <cctype>

#include "common/error.h"

// cmake/CudaKernels.cmake sets it on this file only, so that another arch
// list recompiles nothing else.
#ifndef BRAID_CUDA_KERNEL_IMAGES
#define BRAID_CUDA_KERNEL_IMAGES ""
#endif

namespace braid {
namespace cuda {

std::string smName(int cc) { return strCat("sm_", cc); }

bool KernelImages::runOn(int cc) const {
  for (int s : sm) {
    if (s / 10 == cc / 10 && s <= cc) return true;
  }
  for (int p : ptx) {
    if (p <= cc) return true;
  }
  return false;
}

std::string KernelImages::str() const {
  if (empty()) return "none";
  std::vector<std::string> parts;
  for (int s : sm) parts.push_back(smName(s));
  for (int p : ptx) parts.push_back(strCat("compute_", p, " PTX"));
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    out += i == 0 ? "" : i + 1 == parts.size() ? " and " : ", ";
    out += parts[i];
  }
  return out;
}

KernelImages KernelImages::parse(const std::string& list, const char* what) {
  KernelImages k;
  size_t at = 0;
  while (at < list.size()) {
    size_t end = list.find(',', at);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(at, end - at);
    at = end + 1;
    if (item.empty()) continue;
    std::vector<int>* into = nullptr;
    std::string digits;
    if (item.rfind("sm_", 0) == 0) {
      into = &k.sm;
      digits = item.substr(3);
    } else if (item.rfind("compute_", 0) == 0) {
      into = &k.ptx;
      digits = item.substr(8);
    }
    const bool number = !digits.empty() && digits.size() <= 4 &&
                        std::all_of(digits.begin(), digits.end(),
                                    [](unsigned char c) { return std::isdigit(c); });
    if (into == nullptr || !number) {
      throw Error(strCat("braid: ", what, ": '", item, "' in '", list,
                         "' is not sm_<NN> or compute_<NN> (e.g. sm_80,compute_120)"));
    }
    into->push_back(std::stoi(digits));
  }
  for (auto* v : {&k.sm, &k.ptx}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }
  return k;
}

const KernelImages& builtKernelImages() {
  static const KernelImages images =
      KernelImages::parse(BRAID_CUDA_KERNEL_IMAGES, "the build's kernel images");
  return images;
}

}  // namespace cuda
}  // namespace braid
