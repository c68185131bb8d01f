# Sanitizer and fuzzing builds, for fdtrain's code and everything it
# compiles (make test-asan, make test-tsan, make fuzz; each in its own build
# directory). System libraries (Open MPI, OpenBLAS, HDF5, yaml-cpp) are not
# instrumented; tests/sanitizers/ holds the suppressions that this needs.
set(FDTRAIN_SANITIZE "" CACHE STRING
    "Instrument the build: address (ASan + UBSan), thread (TSan), or empty for none")
set_property(CACHE FDTRAIN_SANITIZE PROPERTY STRINGS "" address thread)
option(FDTRAIN_FUZZ "Build the libFuzzer targets of tests/fuzz (clang only; implies ASan + UBSan)" OFF)
# UBSan doubles the compile time of an instrumented translation unit (measured: 4.7 s -> 9.5 s);
# CI's quick pass (make test-asan-ci) builds without it, make test-asan and make fuzz with it.
option(FDTRAIN_UBSAN "With FDTRAIN_SANITIZE=address, also UBSan" ON)

if(FDTRAIN_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "FDTRAIN_FUZZ needs clang (libFuzzer): configure with "
                        "-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++")
  endif()
  set(FDTRAIN_SANITIZE address CACHE STRING "" FORCE)
  # Coverage feedback everywhere; only the fuzz binaries link libFuzzer's main.
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()

if(FDTRAIN_SANITIZE STREQUAL "address" AND (FDTRAIN_UBSAN OR FDTRAIN_FUZZ))
  add_compile_options(-fsanitize=address,undefined -fno-sanitize-recover=undefined
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
elseif(FDTRAIN_SANITIZE STREQUAL "address")
  add_compile_options(-fsanitize=address -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address)
endif()
if(FDTRAIN_SANITIZE STREQUAL "address")
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # GCC 12's -Wmaybe-uninitialized misfires on instrumented code (std::regex's
    # std::function internals in lib/ckpt); GCC documents that sanitizers can
    # cause such false positives. The normal build keeps the warning.
    add_compile_options(-Wno-maybe-uninitialized)
  endif()
elseif(FDTRAIN_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
elseif(NOT FDTRAIN_SANITIZE STREQUAL "")
  message(FATAL_ERROR "FDTRAIN_SANITIZE must be address, thread or empty, not '${FDTRAIN_SANITIZE}'")
endif()

if(NOT FDTRAIN_SANITIZE STREQUAL "")
  # -O1 with line tables only (after the build type's -O2 -g, so these win): the
  # sanitizers' documented setting, reports still name file:line, and the instrumented
  # build compiles in about four fifths of the time (CI builds one, .ci/run).
  add_compile_options(-O1 -g1)
endif()
