// Helpers for the NCCL executor's tests: typed values in raw buffers, and a
// group of ranks (threads) each with an NcclExecutor over the simulated NCCL
// on the simulated device.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cuda/device_api.h"
#include "cuda/nccl/nccl_executor.h"
#include "sim/nccl/nccl_sim.h"
#include "memory_store.h"
#include "math/half.h"

namespace braid {
namespace cuda {
namespace testing {

inline SimulatedDevice& dev() { return simulatedDevice(4); }

// Element i of a buffer of `t`, as a double (bool: 0/1).
inline double getValue(DataType t, const void* p, size_t i) {
  auto b = static_cast<const uint8_t*>(p) + i * elementSize(t);
  switch (t) {
    case DataType::kFloat32: {
      float v;
      std::memcpy(&v, b, 4);
      return v;
    }
    case DataType::kFloat64: {
      double v;
      std::memcpy(&v, b, 8);
      return v;
    }
    case DataType::kFloat16: {
      uint16_t v;
      std::memcpy(&v, b, 2);
      return reduce::halfToFloat(v);
    }
    case DataType::kBFloat16: {
      uint16_t v;
      std::memcpy(&v, b, 2);
      return reduce::bf16ToFloat(v);
    }
    case DataType::kInt8:
      return static_cast<int8_t>(*b);
    case DataType::kUInt8:
      return *b;
    case DataType::kBool:
      return *b != 0;
    case DataType::kInt16: {
      int16_t v;
      std::memcpy(&v, b, 2);
      return v;
    }
    case DataType::kInt32: {
      int32_t v;
      std::memcpy(&v, b, 4);
      return v;
    }
    case DataType::kInt64: {
      int64_t v;
      std::memcpy(&v, b, 8);
      return static_cast<double>(v);
    }
  }
  return NAN;
}

inline void setValue(DataType t, void* p, size_t i, double v) {
  auto b = static_cast<uint8_t*>(p) + i * elementSize(t);
  switch (t) {
    case DataType::kFloat32: {
      float x = static_cast<float>(v);
      std::memcpy(b, &x, 4);
      return;
    }
    case DataType::kFloat64:
      std::memcpy(b, &v, 8);
      return;
    case DataType::kFloat16: {
      uint16_t x = reduce::floatToHalf(static_cast<float>(v));
      std::memcpy(b, &x, 2);
      return;
    }
    case DataType::kBFloat16: {
      uint16_t x = reduce::floatToBf16(static_cast<float>(v));
      std::memcpy(b, &x, 2);
      return;
    }
    case DataType::kInt8:
      *b = static_cast<uint8_t>(static_cast<int8_t>(v));
      return;
    case DataType::kUInt8:
      *b = static_cast<uint8_t>(v);
      return;
    case DataType::kBool:
      *b = v != 0;
      return;
    case DataType::kInt16: {
      int16_t x = static_cast<int16_t>(v);
      std::memcpy(b, &x, 2);
      return;
    }
    case DataType::kInt32: {
      int32_t x = static_cast<int32_t>(v);
      std::memcpy(b, &x, 4);
      return;
    }
    case DataType::kInt64: {
      int64_t x = static_cast<int64_t>(v);
      std::memcpy(b, &x, 8);
      return;
    }
  }
}

// Rank r's element i: small integers, exact in every dtype and their sums.
inline double x(DataType t, int r, size_t i) {
  if (t == DataType::kBool) return (r + i) % 3 == 0;
  return (r + 1) + static_cast<double>(i % 3);
}

// The SUM of x over n ranks (bool: or).
inline double sumX(DataType t, int n, size_t i) {
  double s = 0;
  for (int r = 0; r < n; ++r) s = t == DataType::kBool ? (s || x(t, r, i)) : s + x(t, r, i);
  return s;
}

// "Device memory" of the simulated device, freed with the holder.
struct DeviceBuffer {
  DeviceBuffer(DataType t, size_t count, int device = 0)
      : type(t),
        n(count),
        p(dev().deviceAlloc(device, std::max<size_t>(1, count * elementSize(t)))) {}
  ~DeviceBuffer() { dev().deviceFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  double get(size_t i) const { return getValue(type, p, i); }
  void set(size_t i, double v) { setValue(type, p, i, v); }
  DataType type;
  size_t n;
  void* p;
};

inline NcclExecutor::Options options(int rank, int size, int timeoutMs = 20000) {
  NcclExecutor::Options o;
  o.rank = rank;
  o.size = size;
  o.storePrefix = "test/";
  o.timeout = std::chrono::milliseconds(timeoutMs);
  o.pollInterval = std::chrono::microseconds(500);
  return o;
}

inline NcclOp op(NcclOpKind kind, const void* in, void* out, size_t count, DataType t,
                 ReduceOp r = ReduceOp::kSum, int root = 0) {
  NcclOp o;
  o.kind = kind;
  o.in = in;
  o.out = out;
  o.count = count;
  o.dtype = t;
  o.redop = r;
  o.root = root;
  return o;
}

}  // namespace testing
}  // namespace cuda
}  // namespace braid
