# The CUDA reduce kernels (csrc/cuda/kernels.cu), compiled by nvcc into a
# fatbin and embedded in braid as a byte array (csrc/cuda/cuda_kernels.cc
# loads it with cudaLibraryLoadData at first use). No CUDA header or library
# is needed to build or load braid: without nvcc the build goes on, groups
# stage CUDA tensors where they would have launched braid's kernels, and
# reduceAsync on a real GPU throws "built without nvcc" (the simulated device
# runs the same kernel bodies on the CPU and needs none of this).
#
# BRAID_CUDA_KERNELS: AUTO (default: build when nvcc is found as
# CMAKE_CUDA_COMPILER, at $CUDA_HOME/bin/nvcc, /usr/local/cuda/bin/nvcc or on
# PATH), ON (nvcc required) or OFF.
# Sets BRAID_CUDA_FATBIN_SOURCES (the generated .cc, or empty) and
# BRAID_CUDA_KERNEL_IMAGES ("sm_80,...,compute_120", or empty), which
# csrc/cuda/kernel_images.cc is compiled with.
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

# Note [Kernel images] (csrc/cuda/kernel_images.h): which GPUs the fatbin runs on.
# BRAID_CUDA_ARCHS: machine code for these compute capabilities (80 is sm_80),
# and BRAID_CUDA_TORCH_ARCHS adds those the torch in use was built for (setup.py
# passes torch._C._cuda_getArchFlags(): "sm_50 sm_60 ... sm_90"); both keep
# only what this nvcc can build (nvcc --list-gpu-arch). PTX of
# BRAID_CUDA_PTX_ARCH (empty: the newest of the list; OFF: none) runs on GPUs
# newer than the list. The default covers A100 and A30 (8.0), A10, A40 and RTX
# 30xx (8.6, and Orin's 8.7), L4, L40S and RTX 40xx (8.9), H100 and H200 (9.0),
# B200 (10.0, and 10.3) and RTX 50xx (12.0, 12.1); not Turing (7.5), which stages.
set(BRAID_CUDA_ARCHS "80;86;89;90;100;120" CACHE STRING
  "Compute capabilities to build the CUDA kernels' machine code for (80 is sm_80)")
set(BRAID_CUDA_TORCH_ARCHS "" CACHE STRING
  "torch's own CUDA arch list (sm_80 sm_90 ...), built too where nvcc can (setup.py sets it)")
set(BRAID_CUDA_PTX_ARCH "" CACHE STRING
  "PTX for newer GPUs: a compute capability, empty for the newest of the list, or OFF")
# BRAID_CUDA_ARCH_FLAGS (-gencode flags, sm_90 only) is gone: a build directory
# that cached it would otherwise go on building for Hopper alone.
unset(BRAID_CUDA_ARCH_FLAGS CACHE)
set(BRAID_CUDA_KERNEL_IMAGES "")
# What the default list builds, with or without nvcc: the simulated device's
# images when this build has none (tests/sim/device/sim_arch.cc says why).
set(BRAID_CUDA_DEFAULT_IMAGES "sm_80,sm_86,sm_89,sm_90,sm_100,sm_120,compute_120")

if(BRAID_NVCC AND NOT BRAID_CUDA_KERNELS STREQUAL "OFF")
  # "sm_90a", "compute_90", "9.0" and "90" all name 90.
  set(_wanted "")
  string(REPLACE " " ";" _torch_archs "${BRAID_CUDA_TORCH_ARCHS}")
  foreach(a IN LISTS BRAID_CUDA_ARCHS _torch_archs)
    string(REGEX REPLACE "^(sm_|compute_)" "" a "${a}")
    string(REPLACE "." "" a "${a}")
    string(REGEX REPLACE "[a-z]+$" "" a "${a}")
    if(a MATCHES "^[0-9]+$")
      list(APPEND _wanted ${a})
    elseif(NOT a STREQUAL "")
      message(FATAL_ERROR "braid: '${a}' in BRAID_CUDA_ARCHS/BRAID_CUDA_TORCH_ARCHS is not a compute capability")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES _wanted)
  list(SORT _wanted COMPARE NATURAL)
  execute_process(COMMAND "${BRAID_NVCC}" --list-gpu-arch OUTPUT_VARIABLE _nvcc_archs
    RESULT_VARIABLE _rc ERROR_QUIET)
  set(_archs "")
  set(_dropped "")
  if(_rc EQUAL 0)
    string(REGEX MATCHALL "compute_[0-9]+" _nvcc_archs "${_nvcc_archs}")
    foreach(a IN LISTS _wanted)
      if("compute_${a}" IN_LIST _nvcc_archs)
        list(APPEND _archs ${a})
      else()
        list(APPEND _dropped sm_${a})
      endif()
    endforeach()
  else()
    set(_archs ${_wanted})  # an nvcc without --list-gpu-arch (before 11.0): as asked
  endif()
  if(NOT _archs)
    message(FATAL_ERROR "braid: ${BRAID_NVCC} builds none of the CUDA archs asked for (${_wanted})")
  endif()
  list(GET _archs 0 _lowest)
  list(GET _archs -1 _ptx)
  if(BRAID_CUDA_PTX_ARCH STREQUAL "OFF")
    set(_ptx "")
  elseif(NOT BRAID_CUDA_PTX_ARCH STREQUAL "")
    set(_ptx ${BRAID_CUDA_PTX_ARCH})
  endif()
  # All machine code comes from one PTX, the lowest arch's: the kernels use no
  # instruction newer than sm_80's (kernels.cuh asks only whether it runs on a
  # GPU), so code for sm_120 compiled from compute_80 PTX is the same program,
  # and nvcc runs its front end twice instead of once per arch (the default
  # list: 11 s instead of 18 s, on 2 busy cores; sm_90 alone took 3 s).
  set(_sm "")
  set(_images "")
  foreach(a IN LISTS _archs)
    list(APPEND _sm sm_${a})
    list(APPEND _images sm_${a})
  endforeach()
  string(REPLACE ";" "," _sm "${_sm}")
  set(BRAID_CUDA_NVCC_ARCH_FLAGS -gencode "arch=compute_${_lowest},code=[${_sm}]")
  if(NOT _ptx STREQUAL "")
    list(APPEND BRAID_CUDA_NVCC_ARCH_FLAGS -gencode "arch=compute_${_ptx},code=compute_${_ptx}")
    list(APPEND _images compute_${_ptx})
  endif()
  # Compressed machine code, as nvcc compresses the PTX by default (the same
  # scheme, so a driver that loads the one unpacks the other): 0.37 MB
  # instead of 4.6 MB embedded, which g++ then compiles as a byte array.
  list(APPEND BRAID_CUDA_NVCC_ARCH_FLAGS -Xfatbin -compress-all)
  string(REPLACE ";" "," BRAID_CUDA_KERNEL_IMAGES "${_images}")
  if(_dropped)
    string(REPLACE ";" ", " _dropped "${_dropped}")
    message(STATUS "braid: CUDA kernels: ${BRAID_NVCC} cannot build ${_dropped}: left out")
  endif()
  set(_fatbin "${CMAKE_CURRENT_BINARY_DIR}/braid_kernels.fatbin")
  set(_embedded "${CMAKE_CURRENT_BINARY_DIR}/braid_kernels_fatbin.cc")
  set(_ccbin "")
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    set(_ccbin -ccbin "${CMAKE_CXX_COMPILER}")
  endif()
  # The fatbin depends on its flags too: a Makefile build does not rerun a
  # custom command whose command line changed.
  set(_flags_stamp "${CMAKE_CURRENT_BINARY_DIR}/braid_kernels.flags")
  file(CONFIGURE OUTPUT "${_flags_stamp}" CONTENT "${BRAID_NVCC} ${BRAID_CUDA_NVCC_ARCH_FLAGS}\n")
  add_custom_command(OUTPUT "${_fatbin}"
    COMMAND "${BRAID_NVCC}" --fatbin -std=c++17 -O3 -fmad=false ${BRAID_CUDA_NVCC_ARCH_FLAGS}
      ${_ccbin} -I "${CMAKE_CURRENT_SOURCE_DIR}/csrc"
      -o "${_fatbin}" "${CMAKE_CURRENT_SOURCE_DIR}/csrc/cuda/kernels.cu"
    DEPENDS csrc/cuda/kernels.cu csrc/cuda/kernels.cuh csrc/cuda/kernels_hooks.cuh
      csrc/cuda/kernel_list.h csrc/common/types.h "${_flags_stamp}"
    COMMENT "nvcc: CUDA kernels -> braid_kernels.fatbin"
    VERBATIM)
  add_custom_command(OUTPUT "${_embedded}"
    COMMAND "${CMAKE_COMMAND}" -DINPUT=${_fatbin} -DOUTPUT=${_embedded}
      -DSYMBOL=braid_kernels_fatbin -P "${CMAKE_CURRENT_SOURCE_DIR}/cmake/EmbedFile.cmake"
    DEPENDS "${_fatbin}" cmake/EmbedFile.cmake
    COMMENT "Embedding braid_kernels.fatbin"
    VERBATIM)
  set(BRAID_CUDA_FATBIN_SOURCES "${_embedded}")
  string(REPLACE "," ", " _shown "${BRAID_CUDA_KERNEL_IMAGES}")
  message(STATUS "braid: CUDA kernels: built with ${BRAID_NVCC} for ${_shown}")
endif()
