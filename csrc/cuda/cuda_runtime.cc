// cudaRuntime(): placeholder until the dlopen-based implementation lands.
#include "common/error.h"
#include "cuda/device_api.h"

namespace braid {
namespace cuda {

DeviceApi& cudaRuntime() {
  throw Error("braid: CUDA tensors need the CUDA runtime, which this build does not load yet");
}

}  // namespace cuda
}  // namespace braid
