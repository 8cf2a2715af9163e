# Note [One libstdc++ per process]
# A Python extension must use the libstdc++ that the process already loaded
# (torch's and Python's), never a private copy. A compiler whose libstdc++
# exists only as a static archive (a toolchain built with --disable-shared,
# such as a custom /opt/gcc) links the parts _C uses into _C itself. Then two
# libstdc++ copies share one process, and objects that one built are read by
# the other: on the GPU machine (torch 2.11, /opt/gcc/bin/g++) every group's
# construction died with SIGSEGV in `std::ostringstream << unsigned long`
# (braid::transport::hostIdentity), running libstdc++ code (lt1-codecvt.o)
# that had been linked into _C. So the build refuses such a compiler and
# names one that has a shared libstdc++, instead of building a module that
# crashes. BRAID_ALLOW_STATIC_LIBSTDCXX=ON overrides (at your own risk).
option(BRAID_ALLOW_STATIC_LIBSTDCXX "Build _C with a compiler that has no shared libstdc++" OFF)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND NOT BRAID_ALLOW_STATIC_LIBSTDCXX)
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so
                  OUTPUT_VARIABLE _braid_libstdcxx OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT IS_ABSOLUTE "${_braid_libstdcxx}" OR NOT EXISTS "${_braid_libstdcxx}")
    set(_braid_other "")
    foreach(_cxx /usr/bin/g++ /usr/bin/c++)
      if(EXISTS ${_cxx} AND NOT _cxx STREQUAL CMAKE_CXX_COMPILER)
        execute_process(COMMAND ${_cxx} -print-file-name=libstdc++.so
                        OUTPUT_VARIABLE _o OUTPUT_STRIP_TRAILING_WHITESPACE)
        if(IS_ABSOLUTE "${_o}" AND EXISTS "${_o}")
          set(_braid_other ${_cxx})
          break()
        endif()
      endif()
    endforeach()
    message(FATAL_ERROR
      "braid: ${CMAKE_CXX_COMPILER} has no shared libstdc++ (-print-file-name=libstdc++.so "
      "gives '${_braid_libstdcxx}'), so it would link a private copy of libstdc++ into "
      "torch_braid._C, beside the one torch loaded, which crashes (Note [One libstdc++ per "
      "process] in cmake/SharedLibstdcxx.cmake). Build with a compiler that has one"
      "${_braid_other}: e.g. CXX=${_braid_other} (or -DCMAKE_CXX_COMPILER=...), or set "
      "-DBRAID_ALLOW_STATIC_LIBSTDCXX=ON to build it anyway.")
  endif()
endif()
