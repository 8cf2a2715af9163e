// Note [Simulated kernel images] in sim_arch.h.
#include "sim/device/sim_arch.h"

#include <cctype>
#include <cstdlib>

#include "common/error.h"

// The default arch list's images (cmake/CudaKernels.cmake).
#ifndef BRAID_SIM_DEFAULT_IMAGES
#define BRAID_SIM_DEFAULT_IMAGES "sm_80,sm_86,sm_89,sm_90,sm_100,sm_120,compute_120"
#endif

namespace braid {
namespace cuda {
namespace sim {
namespace {

constexpr int kDefaultCapability = 90;
constexpr const char* kNoKernelImageCode = "(209 cudaErrorNoKernelImageForDevice)";

}  // namespace

int SimArch::parseCapability(const std::string& s, const char* what) {
  const size_t dot = s.find('.');
  auto digit = [](const std::string& t) {
    return t.size() == 1 && std::isdigit(static_cast<unsigned char>(t[0]));
  };
  const std::string major = s.substr(0, dot);
  const std::string minor = dot == std::string::npos ? "" : s.substr(dot + 1);
  const bool majorOk = !major.empty() && major.size() <= 2 &&
                       std::isdigit(static_cast<unsigned char>(major[0])) &&
                       std::isdigit(static_cast<unsigned char>(major.back()));
  if (!majorOk || !digit(minor)) {
    throw Error(strCat("braid: ", what, ": '", s, "' is not a compute capability (e.g. 7.5)"));
  }
  return std::stoi(major) * 10 + (minor[0] - '0');
}

SimArch::SimArch(int devices) : defaults_(devices, kDefaultCapability) {
  if (const char* env = std::getenv("BRAID_SIM_COMPUTE_CAPABILITY")) {
    const std::string list = env;
    size_t at = 0;
    for (int d = 0; d < devices && at <= list.size(); ++d) {
      size_t end = list.find(',', at);
      if (end == std::string::npos) end = list.size();
      const std::string item = list.substr(at, end - at);
      at = end + 1;
      if (!item.empty()) defaults_[d] = parseCapability(item, "BRAID_SIM_COMPUTE_CAPABILITY");
    }
  }
  const char* env = std::getenv("BRAID_SIM_KERNEL_IMAGES");
  if (env != nullptr && std::string(env) == "none") {
    defaultImages_ = KernelImages{};
  } else if (env != nullptr && *env != '\0') {
    defaultImages_ = KernelImages::parse(env, "BRAID_SIM_KERNEL_IMAGES");
  } else if (!builtKernelImages().empty()) {
    defaultImages_ = builtKernelImages();
  } else {
    defaultImages_ = KernelImages::parse(BRAID_SIM_DEFAULT_IMAGES, "BRAID_SIM_DEFAULT_IMAGES");
  }
  cc_ = defaults_;
  images_ = defaultImages_;
}

int SimArch::computeCapability(int device) const {
  std::lock_guard<std::mutex> lk(mu_);
  return cc_.at(device);
}

void SimArch::setComputeCapability(int device, int cc) {
  std::lock_guard<std::mutex> lk(mu_);
  cc_.at(device) = cc == 0 ? defaults_.at(device) : cc;
}

KernelImages SimArch::images() const {
  std::lock_guard<std::mutex> lk(mu_);
  return images_;
}

void SimArch::setImages(std::optional<KernelImages> images) {
  std::lock_guard<std::mutex> lk(mu_);
  images_ = images ? *images : defaultImages_;
}

std::string SimArch::loadError(int device) const {
  const int cc = computeCapability(device);
  const KernelImages k = images();
  if (k.runOn(cc)) return "";
  if (k.empty()) {
    return "this braid was built without nvcc, so it has no CUDA kernels (the simulated build has "
           "no kernel images)";
  }
  return strCat(kNoKernelImageText, " ", kNoKernelImageCode, ": simulated device ", device,
                " is ", smName(cc), ", and braid's kernels hold ", k.str());
}

void SimArch::checkLaunch(const char* kernel, int device) const {
  const int cc = computeCapability(device);
  const KernelImages k = images();
  if (k.runOn(cc)) return;
  throw Error(strCat("braid: cudaLaunchKernel(", kernel, ", simulated device ", device, ", ",
                     smName(cc), ") failed: ", kNoKernelImageText, " ", kNoKernelImageCode,
                     "; braid's kernels hold ", k.str()));
}

}  // namespace sim
}  // namespace cuda
}  // namespace braid
