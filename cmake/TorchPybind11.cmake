# The pybind11 headers that torch was built with, for torch_braid._C:
# Note [One pybind11 per process] in CMakeLists.txt.
#
# Sets BRAID_PYBIND11_INCLUDE_DIR, BRAID_PYBIND11_VERSION and
# BRAID_PYBIND11_ABI_DEFINES. Needs TORCH_INCLUDE_DIRS and Python3_EXECUTABLE.
# -DBRAID_PYBIND11_INCLUDE_DIR=... overrides the choice.

if(BRAID_PYBIND11_INCLUDE_DIR)
  set(_braid_pybind11_from "BRAID_PYBIND11_INCLUDE_DIR, as given")
else()
  # pip wheels ship the headers they were built with in torch/include;
  # Debian installs torch's headers in /usr/include, beside its pybind11-dev.
  foreach(_dir ${TORCH_INCLUDE_DIRS})
    if(EXISTS "${_dir}/pybind11/detail/common.h")
      set(BRAID_PYBIND11_INCLUDE_DIR "${_dir}")
      set(_braid_pybind11_from "in torch's include path")
      break()
    endif()
  endforeach()
endif()
if(NOT BRAID_PYBIND11_INCLUDE_DIR)
  # Distribution builds (Debian's python3-torch) ship none: they were built
  # with the distribution's pybind11, in the system's include directory.
  find_path(BRAID_SYSTEM_PYBIND11_DIR pybind11/detail/common.h
    PATHS ${Python3_INCLUDE_DIRS} /usr/include /usr/local/include NO_CMAKE_PATH
    NO_CMAKE_ENVIRONMENT_PATH NO_CMAKE_SYSTEM_PATH)
  if(NOT BRAID_SYSTEM_PYBIND11_DIR)
    message(FATAL_ERROR "braid: torch ships no pybind11 headers and none were found on the "
      "system; on Debian install pybind11-dev (the one torch is built with there)")
  endif()
  set(BRAID_PYBIND11_INCLUDE_DIR "${BRAID_SYSTEM_PYBIND11_DIR}")
  set(_braid_pybind11_from "the system's (torch ships none)")
endif()

file(STRINGS "${BRAID_PYBIND11_INCLUDE_DIR}/pybind11/detail/common.h" _braid_pybind11_lines
  REGEX "^#define PYBIND11_VERSION_(MAJOR|MINOR|PATCH) ")
foreach(_part MAJOR MINOR PATCH)
  string(REGEX REPLACE ".*PYBIND11_VERSION_${_part} ([0-9a-z.]+).*" "\\1" _braid_pybind11_${_part}
    "${_braid_pybind11_lines}")
endforeach()
set(BRAID_PYBIND11_VERSION
  "${_braid_pybind11_MAJOR}.${_braid_pybind11_MINOR}.${_braid_pybind11_PATCH}")

# pybind11 2.x folds the compiler, C++ library and ABI into its registry's
# name; torch records the values it was built with and its cpp_extension
# passes them on (torch 2.9 and later, on pybind11 3, pass none).
execute_process(
  COMMAND "${Python3_EXECUTABLE}" -c "
import torch, torch.utils.cpp_extension as ce
f = getattr(ce, '_get_pybind11_abi_build_flags', None)
if f is not None:
    # shell-quoted for a compiler command line: CMake quotes them itself
    flags = [x[2:].replace(chr(92) + chr(34), chr(34)) for x in f() if x.startswith('-D')]
else:
    flags = []
    for name in ('COMPILER_TYPE', 'STDLIB', 'BUILD_ABI'):
        v = getattr(torch._C, '_PYBIND11_' + name, None)
        if v is not None:
            flags.append('PYBIND11_%s=\"%s\"' % (name, v))
print(';'.join(flags))"
  OUTPUT_VARIABLE BRAID_PYBIND11_ABI_DEFINES OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE _braid_rc)
if(NOT _braid_rc EQUAL 0)
  message(FATAL_ERROR "braid: could not ask torch for its pybind11 ABI flags")
endif()

message(STATUS "braid: pybind11 ${BRAID_PYBIND11_VERSION} headers from "
  "${BRAID_PYBIND11_INCLUDE_DIR} (${_braid_pybind11_from}); ABI defines: "
  "${BRAID_PYBIND11_ABI_DEFINES}")
