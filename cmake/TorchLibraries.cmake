# Note [Torch's own libraries]
# TorchConfig.cmake finds each of torch's libraries with
#   find_library(c10_LIBRARY c10 PATHS "${TORCH_INSTALL_PREFIX}/lib")
# and CMake searches the system's directories before PATHS. On a machine that has Debian's
# libtorch-dev beside a torch from PyPI (a venv), the venv's build therefore linked
# /usr/lib/x86_64-linux-gnu/libc10.so (torch 1.13) next to the wheel's libtorch: _C then
# needed both libc10.so.1.13 and libc10.so, and the first error torch's code raised inside
# braid went through the wrong c10 and crashed the process (found building against PyPI's
# torch 2.15 on a machine with Debian's 1.13). So, before find_package(Torch):
# torch's own lib directory goes first in CMAKE_LIBRARY_PATH, which CMake searches before the
# system's; and after it, every library TORCH_LIBRARIES names by path must lie in that
# directory (or be a CUDA library), or the configure step fails and says which.
#
# braid_torch_prefix(<var>): the TORCH_INSTALL_PREFIX that TorchConfig.cmake will compute
# (three levels above the directory holding TorchConfig.cmake), from Torch_DIR or
# CMAKE_PREFIX_PATH; empty when neither names one.
function(braid_torch_prefix var)
  set(dirs)
  if(Torch_DIR)
    list(APPEND dirs "${Torch_DIR}")
  endif()
  foreach(p IN LISTS CMAKE_PREFIX_PATH)
    list(APPEND dirs "${p}/Torch" "${p}/share/cmake/Torch")
  endforeach()
  foreach(d IN LISTS dirs)
    if(EXISTS "${d}/TorchConfig.cmake")
      get_filename_component(prefix "${d}/../../.." ABSOLUTE)
      set(${var} "${prefix}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${var} "" PARENT_SCOPE)
endfunction()

braid_torch_prefix(BRAID_TORCH_PREFIX)
if(DEFINED ENV{TORCH_INSTALL_PREFIX})
  set(BRAID_TORCH_PREFIX "$ENV{TORCH_INSTALL_PREFIX}")
endif()
if(BRAID_TORCH_PREFIX AND EXISTS "${BRAID_TORCH_PREFIX}/lib")
  list(PREPEND CMAKE_LIBRARY_PATH "${BRAID_TORCH_PREFIX}/lib")
endif()

# After find_package(Torch): the check.
function(braid_check_torch_libraries)
  if(NOT BRAID_TORCH_PREFIX OR NOT EXISTS "${BRAID_TORCH_PREFIX}/lib")
    return()
  endif()
  get_filename_component(lib "${BRAID_TORCH_PREFIX}/lib" REALPATH)
  foreach(l IN LISTS TORCH_LIBRARIES)
    if(NOT IS_ABSOLUTE "${l}" OR NOT l MATCHES "/lib(c10|torch|caffe2)[^/]*\\.so")
      continue()
    endif()
    get_filename_component(dir "${l}" DIRECTORY)
    get_filename_component(dir "${dir}" REALPATH)
    if(NOT dir STREQUAL lib)
      message(FATAL_ERROR "braid: torch's library ${l} was found outside the torch being "
        "built against (${lib}): another torch is installed on this machine. Delete this "
        "build directory's CMakeCache.txt and configure again (Note [Torch's own libraries] "
        "in cmake/TorchLibraries.cmake).")
    endif()
  endforeach()
endfunction()
