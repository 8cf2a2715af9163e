// Compute capabilities and kernel images (Note [Kernel images] in
// csrc/cuda/kernel_images.h): CUDA's rule for which image runs where, the
// build's fatbin against the images it claims, and the simulated device's
// rule (Note [Simulated kernel images] in tests/sim/device/sim_arch.h),
// including its self-test: a launch on a device without an image fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda/cuda_kernels.h"
#include "cuda/kernel_images.h"
#include "sim/device/sim_arch.h"
#include "sim/device/sim_device.h"

namespace braid {
namespace cuda {
namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

SimulatedDevice& dev() { return simulatedDevice(2); }

TEST(KernelImages, CudasRuleForMachineCodeAndPtx) {
  // What braid built before: sm_90 code and compute_90 PTX.
  KernelImages hopper = KernelImages::parse("sm_90,compute_90", "test");
  EXPECT_EQ(hopper.str(), "sm_90 and compute_90 PTX");
  for (int cc : {75, 80, 86, 87, 89}) EXPECT_FALSE(hopper.runOn(cc)) << cc;
  for (int cc : {90, 100, 103, 120, 121}) EXPECT_TRUE(hopper.runOn(cc)) << cc;  // 10.0 on: PTX
  // Machine code runs on later minors of its own major only.
  KernelImages ampere = KernelImages::parse("sm_80", "test");
  for (int cc : {80, 86, 87, 89}) EXPECT_TRUE(ampere.runOn(cc)) << cc;
  for (int cc : {75, 90, 100}) EXPECT_FALSE(ampere.runOn(cc)) << cc;
  EXPECT_FALSE(KernelImages::parse("sm_86", "test").runOn(80));
  // The default list: every GPU from 8.0 on but 11.x (no sm_110, and the PTX
  // is 12.0's), and nothing older.
  KernelImages def =
      KernelImages::parse("sm_80,sm_86,sm_89,sm_90,sm_100,sm_120,compute_120", "test");
  EXPECT_EQ(def.str(), "sm_80, sm_86, sm_89, sm_90, sm_100, sm_120 and compute_120 PTX");
  for (int cc : {80, 86, 87, 89, 90, 100, 103, 120, 121, 130}) EXPECT_TRUE(def.runOn(cc)) << cc;
  for (int cc : {60, 70, 75, 110}) EXPECT_FALSE(def.runOn(cc)) << cc;
  // None: a build without nvcc.
  KernelImages none = KernelImages::parse("", "test");
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.str(), "none");
  EXPECT_FALSE(none.runOn(90));
  // Sorted, without repeats; junk is an error naming it.
  EXPECT_EQ(KernelImages::parse("sm_90,sm_80,sm_90", "test").sm, (std::vector<int>{80, 90}));
  std::string e = errorOf([] { KernelImages::parse("sm_80,gfx90a", "the list"); });
  EXPECT_TRUE(contains(e, "the list: 'gfx90a' in 'sm_80,gfx90a' is not sm_<NN> or compute_<NN>"))
      << e;
  EXPECT_THROW(KernelImages::parse("sm_", "test"), Error);
  EXPECT_THROW(KernelImages::parse("compute_9x", "test"), Error);
  EXPECT_EQ(smName(75), "sm_75");
}

// The fatbin's entries (its container format: a 16-byte header, then entries
// of kind 1 (PTX) or 2 (ELF) whose header holds the arch at byte 28), read
// back and compared with the images the build claims.
KernelImages imagesInFatbin(const unsigned char* p, size_t bytes) {
  auto u16 = [&](size_t at) { uint16_t v; std::memcpy(&v, p + at, 2); return v; };
  auto u32 = [&](size_t at) { uint32_t v; std::memcpy(&v, p + at, 4); return v; };
  uint64_t fatSize;
  std::memcpy(&fatSize, p + 8, 8);
  EXPECT_EQ(u32(0), 0xBA55ED50u) << "not a fatbin";
  EXPECT_EQ(16 + fatSize, bytes);
  KernelImages k;
  for (size_t at = u16(6); at < 16 + fatSize;) {
    const uint16_t kind = u16(at);
    const int sm = static_cast<int>(u32(at + 28));
    if (kind == 1) k.ptx.push_back(sm);
    if (kind == 2) k.sm.push_back(sm);
    at += u32(at + 4) + u32(at + 8);  // header size + padded payload
  }
  for (auto* v : {&k.sm, &k.ptx}) std::sort(v->begin(), v->end());
  return k;
}

TEST(KernelImages, TheBuildsFatbinHoldsWhatItClaims) {
  size_t bytes = 0;
  const unsigned char* fatbin = kernelFatbin(&bytes);
  if (!haveKernels()) {
    EXPECT_EQ(fatbin, nullptr);
    EXPECT_TRUE(builtKernelImages().empty());
    GTEST_SKIP() << "this build has no CUDA kernels (built without nvcc)";
  }
  const KernelImages in = imagesInFatbin(fatbin, bytes);
  EXPECT_EQ(in.sm, builtKernelImages().sm) << in.str() << " vs " << builtKernelImages().str();
  EXPECT_EQ(in.ptx, builtKernelImages().ptx) << in.str() << " vs " << builtKernelImages().str();
}

// Issue 42: the default build runs on A100 (8.0), A10 (8.6), L40S and RTX
// 4090 (8.9), H100 (9.0), B200 (10.0), RTX 5090 (12.0) and, through PTX,
// later GPUs. (A build with another BRAID_CUDA_ARCHS, or an nvcc that lacks
// some of them, fails this on purpose: it does not.)
TEST(KernelImages, TheDefaultBuildRunsOnAmpereAndLater) {
  if (!haveKernels()) GTEST_SKIP() << "this build has no CUDA kernels (built without nvcc)";
  const KernelImages& k = builtKernelImages();
  for (int cc : {80, 86, 89, 90, 100, 120}) {
    EXPECT_TRUE(std::count(k.sm.begin(), k.sm.end(), cc) == 1) << smName(cc) << ": " << k.str();
  }
  EXPECT_TRUE(k.runOn(130)) << "no PTX for newer GPUs: " << k.str();
  EXPECT_FALSE(k.runOn(75)) << k.str();
}

// Note [Simulated kernel images]: the device's compute capability and the
// images, and the self-test that the rule bites.
TEST(SimArch, ComputeCapabilityAndImagesDefaultAndCanBeSet) {
  EXPECT_EQ(dev().computeCapability(0), 90);
  EXPECT_EQ(dev().computeCapability(1), 90);
  EXPECT_EQ(dev().kernelLoadError(0), "");
  dev().setComputeCapability(1, 75);
  EXPECT_EQ(dev().computeCapability(1), 75);
  EXPECT_EQ(dev().computeCapability(0), 90);
  const std::string why = dev().kernelLoadError(1);
  EXPECT_TRUE(contains(why, "no kernel image is available for execution on the device (209 "
                            "cudaErrorNoKernelImageForDevice): simulated device 1 is sm_75"))
      << why;
  dev().setComputeCapability(1, 0);
  EXPECT_EQ(dev().computeCapability(1), 90);
  EXPECT_EQ(dev().kernelLoadError(1), "");
  EXPECT_THROW(dev().setComputeCapability(2, 75), Error);
  EXPECT_THROW(dev().computeCapability(-1), Error);
}

TEST(SimArch, ALaunchOnADeviceWithoutAnImageFails) {
  dev().setComputeCapability(1, 75);
  Stream s0 = dev().streamCreate(0);
  Stream s1 = dev().streamCreate(1);
  const size_t n = 100;
  auto* a = static_cast<float*>(dev().deviceAlloc(1, n * 4));
  auto* b = static_cast<float*>(dev().deviceAlloc(1, n * 4));
  for (size_t i = 0; i < n; ++i) a[i] = b[i] = 1.0f;
  std::string e = errorOf([&] { dev().reduceAsync(DataType::kFloat32, ReduceOp::kSum, a, b, n, s1); });
  EXPECT_TRUE(contains(e, "braid: cudaLaunchKernel(braid_reduce_f32_sum, simulated device 1, "
                          "sm_75) failed: no kernel image is available for execution on the "
                          "device (209 cudaErrorNoKernelImageForDevice)"))
      << e;
  const void* srcs[] = {a, b};
  e = errorOf([&] {
    dev().reduceMultiAsync(DataType::kFloat32, ReduceOp::kSum, a, srcs, 2, 1.0, n, s1);
  });
  EXPECT_TRUE(contains(e, "no kernel image is available for execution on the device")) << e;
  // Nothing ran; a launch of nothing launches nothing (as on CUDA); device 0 runs.
  dev().streamSynchronize(s1);
  EXPECT_EQ(a[0], 1.0f);
  dev().reduceAsync(DataType::kFloat32, ReduceOp::kSum, a, b, 0, s1);
  dev().reduceAsync(DataType::kFloat32, ReduceOp::kSum, a, b, n, s0);
  dev().streamSynchronize(s0);
  EXPECT_EQ(a[n - 1], 2.0f);
  // An 8.7 device runs sm_80/sm_86 code: its launch goes through.
  dev().setComputeCapability(1, 87);
  dev().reduceAsync(DataType::kFloat32, ReduceOp::kSum, a, b, n, s1);
  dev().streamSynchronize(s1);
  EXPECT_EQ(a[0], 3.0f);
  dev().setComputeCapability(1, 0);
  dev().streamDestroy(s0);
  dev().streamDestroy(s1);
  dev().deviceFree(a);
  dev().deviceFree(b);
}

TEST(SimArch, ABuildWithoutKernelsRunsNone) {
  dev().setKernelImages(KernelImages{});
  EXPECT_TRUE(contains(dev().kernelLoadError(0), "built without nvcc")) << dev().kernelLoadError(0);
  Stream s = dev().streamCreate(0);
  auto* a = static_cast<int32_t*>(dev().deviceAlloc(0, 64));
  std::string e = errorOf([&] { dev().reduceAsync(DataType::kInt32, ReduceOp::kMax, a, a, 16, s); });
  EXPECT_TRUE(contains(e, "no kernel image is available") && contains(e, "kernels hold none")) << e;
  // Only PTX for 9.0: an 8.9 device has none, a 10.0 one compiles it.
  dev().setKernelImages(KernelImages::parse("compute_90", "test"));
  dev().setComputeCapability(0, 89);
  EXPECT_TRUE(contains(dev().kernelLoadError(0), "is sm_89, and braid's kernels hold compute_90 PTX"))
      << dev().kernelLoadError(0);
  dev().setComputeCapability(0, 100);
  EXPECT_EQ(dev().kernelLoadError(0), "");
  dev().setComputeCapability(0, 0);
  dev().setKernelImages(std::nullopt);
  EXPECT_EQ(dev().kernelLoadError(0), "");
  dev().streamDestroy(s);
  dev().deviceFree(a);
}

// The environment, read when a simulated device is made.
TEST(SimArch, SettingsFromTheEnvironment) {
  setenv("BRAID_SIM_COMPUTE_CAPABILITY", "8.6,7.5", 1);
  setenv("BRAID_SIM_KERNEL_IMAGES", "sm_80,compute_90", 1);
  {
    sim::SimArch arch(3);
    EXPECT_EQ(arch.computeCapability(0), 86);
    EXPECT_EQ(arch.computeCapability(1), 75);
    EXPECT_EQ(arch.computeCapability(2), 90);  // not listed: the default
    EXPECT_EQ(arch.images().str(), "sm_80 and compute_90 PTX");
    EXPECT_EQ(arch.loadError(0), "");
    EXPECT_TRUE(contains(arch.loadError(1), "is sm_75")) << arch.loadError(1);
    arch.setComputeCapability(1, 0);  // back to the environment's
    EXPECT_EQ(arch.computeCapability(1), 75);
  }
  setenv("BRAID_SIM_KERNEL_IMAGES", "none", 1);
  EXPECT_TRUE(sim::SimArch(1).images().empty());
  setenv("BRAID_SIM_COMPUTE_CAPABILITY", "9", 1);
  std::string e = errorOf([] { sim::SimArch arch(1); });
  EXPECT_TRUE(contains(e, "BRAID_SIM_COMPUTE_CAPABILITY: '9' is not a compute capability")) << e;
  unsetenv("BRAID_SIM_COMPUTE_CAPABILITY");
  unsetenv("BRAID_SIM_KERNEL_IMAGES");
  // Unset: 9.0 everywhere, and the build's images (or the default list's,
  // for a build without nvcc).
  sim::SimArch arch(2);
  EXPECT_EQ(arch.computeCapability(1), 90);
  if (haveKernels()) {
    EXPECT_EQ(arch.images().str(), builtKernelImages().str());
  } else {
    EXPECT_EQ(arch.images().str(), "sm_80, sm_86, sm_89, sm_90, sm_100, sm_120 and compute_120 PTX");
  }
  EXPECT_EQ(sim::SimArch::parseCapability("12.1", "x"), 121);
  EXPECT_EQ(sim::SimArch::parseCapability("7.5", "x"), 75);
  EXPECT_THROW(sim::SimArch::parseCapability("7.", "x"), Error);
  EXPECT_THROW(sim::SimArch::parseCapability("a.5", "x"), Error);
}

}  // namespace
}  // namespace cuda
}  // namespace braid
