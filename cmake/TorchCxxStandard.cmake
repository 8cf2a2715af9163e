# The C++ standard torch's headers need: 17, or 20 where ATen/ATen.h says so
# (torch 2.14: "#error C++20 or later compatible compiler is required").
# Reading the header, not the version number, keeps this right for builds
# whose cut-off differs (vendor and distribution builds).
#
# Sets BRAID_CXX_STANDARD unless it is given (-DBRAID_CXX_STANDARD=20).
if(NOT BRAID_CXX_STANDARD)
  set(BRAID_CXX_STANDARD 17)
  foreach(_dir ${TORCH_INCLUDE_DIRS})
    if(EXISTS "${_dir}/ATen/ATen.h")
      file(STRINGS "${_dir}/ATen/ATen.h" _braid_cxx20 REGEX "__cplusplus < 202002L")
      if(_braid_cxx20)
        set(BRAID_CXX_STANDARD 20)
      endif()
      break()
    endif()
  endforeach()
endif()
message(STATUS "braid: C++${BRAID_CXX_STANDARD} (what torch's headers need)")
