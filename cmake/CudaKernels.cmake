# The CUDA reduce kernels (csrc/cuda/kernels.cu), compiled by nvcc into a
# fatbin and embedded in braid as a byte array (csrc/cuda/cuda_kernels.cc
# loads it with cudaLibraryLoadData at first use). No CUDA header or library
# is needed to build or load braid: without nvcc the build goes on, and
# reduceAsync on a real GPU throws "built without nvcc" (the simulated device
# runs the same kernel bodies on the CPU and needs none of this).
#
# BRAID_CUDA_KERNELS: AUTO (default: build when nvcc is found as
# CMAKE_CUDA_COMPILER, at $CUDA_HOME/bin/nvcc, /usr/local/cuda/bin/nvcc or on
# PATH), ON (nvcc required) or OFF.
# Sets BRAID_CUDA_FATBIN_SOURCES (the generated .cc, or empty).
set(BRAID_CUDA_KERNELS AUTO CACHE STRING "Build the CUDA kernels' fatbin with nvcc: AUTO, ON or OFF")
set_property(CACHE BRAID_CUDA_KERNELS PROPERTY STRINGS AUTO ON OFF)
set(BRAID_CUDA_FATBIN_SOURCES "")

if(NOT BRAID_CUDA_KERNELS STREQUAL "OFF")
  if(CMAKE_CUDA_COMPILER)
    set(BRAID_NVCC "${CMAKE_CUDA_COMPILER}")
  else()
    find_program(BRAID_NVCC nvcc HINTS "$ENV{CUDA_HOME}/bin" /usr/local/cuda/bin)
  endif()
  if(NOT BRAID_NVCC)
    if(BRAID_CUDA_KERNELS STREQUAL "ON")
      message(FATAL_ERROR "braid: BRAID_CUDA_KERNELS=ON but nvcc was not found "
        "(set CMAKE_CUDA_COMPILER or CUDA_HOME)")
    endif()
    message(STATUS "braid: CUDA kernels: not built (no nvcc); reduceAsync on a GPU will throw")
  endif()
endif()

if(BRAID_NVCC AND NOT BRAID_CUDA_KERNELS STREQUAL "OFF")
  # sm_90 machine code, and compute_90 PTX that the driver JIT-compiles for
  # newer GPUs. -fmad=false: see kernels.cuh (the CPU path rounds twice where
  # an FMA would round once).
  set(BRAID_CUDA_ARCH_FLAGS
    -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
    CACHE STRING "nvcc -gencode flags for the CUDA kernels")
  set(_fatbin "${CMAKE_CURRENT_BINARY_DIR}/braid_kernels.fatbin")
  set(_embedded "${CMAKE_CURRENT_BINARY_DIR}/braid_kernels_fatbin.cc")
  set(_ccbin "")
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    set(_ccbin -ccbin "${CMAKE_CXX_COMPILER}")
  endif()
  add_custom_command(OUTPUT "${_fatbin}"
    COMMAND "${BRAID_NVCC}" --fatbin -std=c++17 -O3 -fmad=false ${BRAID_CUDA_ARCH_FLAGS}
      ${_ccbin} -I "${CMAKE_CURRENT_SOURCE_DIR}/csrc"
      -o "${_fatbin}" "${CMAKE_CURRENT_SOURCE_DIR}/csrc/cuda/kernels.cu"
    DEPENDS csrc/cuda/kernels.cu csrc/cuda/kernels.cuh csrc/cuda/kernels_hooks.cuh
      csrc/cuda/kernel_list.h csrc/common/types.h
    COMMENT "nvcc: CUDA kernels -> braid_kernels.fatbin"
    VERBATIM)
  add_custom_command(OUTPUT "${_embedded}"
    COMMAND "${CMAKE_COMMAND}" -DINPUT=${_fatbin} -DOUTPUT=${_embedded}
      -DSYMBOL=braid_kernels_fatbin -P "${CMAKE_CURRENT_SOURCE_DIR}/cmake/EmbedFile.cmake"
    DEPENDS "${_fatbin}" cmake/EmbedFile.cmake
    COMMENT "Embedding braid_kernels.fatbin"
    VERBATIM)
  set(BRAID_CUDA_FATBIN_SOURCES "${_embedded}")
  message(STATUS "braid: CUDA kernels: built with ${BRAID_NVCC} (${BRAID_CUDA_ARCH_FLAGS})")
endif()
