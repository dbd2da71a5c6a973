# cmake/moekit_torch.cmake: finds the PyTorch that the Python extension (csrc/torch/, MOEKIT_PYTHON=ON)
# builds against, as an imported target `moekit_torch_libs`, and sets
#   MOEKIT_TORCH_CUDA   ON when that torch is a CUDA build
#   MOEKIT_TORCH_LIBDIR its lib/ folder
#   MOEKIT_TORCH_VERSION its torch.__version__ (recorded in the package: python/moekit/_ops.py)
# and compiles everything after it with torch's _GLIBCXX_USE_CXX11_ABI.
# A CPU-only torch turns MOEKIT_CUDA=AUTO into OFF (the extension could not reach a CUDA stream).
#
# NOTE: torch is asked through the Python interpreter (Python_EXECUTABLE, which scikit-build-core
# sets to the interpreter running `pip install`) with PYTHONPATH unset: pip's build isolation hides
# the target environment's site-packages through PYTHONPATH, and the extension must link the torch
# the user runs, not a second copy downloaded into the isolated build environment.
# NOTE: torch's own TorchConfig.cmake (find_package(Torch)) is not used: for a CUDA build of torch
# it insists on a matching CUDA toolchain even when only the CPU extension is wanted. The extension
# needs only headers, libtorch / libtorch_cpu / libc10 (+ libc10_cuda) and the C++ ABI flag, the
# same facts torch.utils.cpp_extension uses.
find_package(Python COMPONENTS Interpreter REQUIRED)
set(_moekit_torch_query [=[
import os, sys, torch, torch.utils.cpp_extension as ext
print("|".join(ext.include_paths()))
print(os.path.join(os.path.dirname(torch.__file__), "lib"))
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print("ON" if torch.version.cuda else "OFF")
print(torch.__version__)
]=])
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env --unset=PYTHONPATH ${Python_EXECUTABLE} -c "${_moekit_torch_query}"
  OUTPUT_VARIABLE _moekit_torch_out ERROR_VARIABLE _moekit_torch_err RESULT_VARIABLE _moekit_torch_rc
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _moekit_torch_rc EQUAL 0)
  message(FATAL_ERROR "MOEKIT_PYTHON: cannot import torch with ${Python_EXECUTABLE}; install torch into "
                      "that environment first (pip install torch).\n${_moekit_torch_err}")
endif()
# One fact per line; the include dirs are joined by '|' so the lines can become a CMake list.
string(REPLACE "\n" ";" _moekit_torch_fields "${_moekit_torch_out}")
list(GET _moekit_torch_fields 0 _moekit_torch_includes)
list(GET _moekit_torch_fields 1 MOEKIT_TORCH_LIBDIR)
list(GET _moekit_torch_fields 2 _moekit_torch_abi)
list(GET _moekit_torch_fields 3 MOEKIT_TORCH_CUDA)
list(GET _moekit_torch_fields 4 _moekit_torch_version)
set(MOEKIT_TORCH_VERSION "${_moekit_torch_version}")
string(REPLACE "|" ";" _moekit_torch_includes "${_moekit_torch_includes}")
message(STATUS "moekit: torch ${_moekit_torch_version} (CUDA build: ${MOEKIT_TORCH_CUDA}) in ${MOEKIT_TORCH_LIBDIR}")

add_library(moekit_torch_libs INTERFACE IMPORTED)
target_include_directories(moekit_torch_libs SYSTEM INTERFACE ${_moekit_torch_includes})
target_link_libraries(moekit_torch_libs INTERFACE ${MOEKIT_TORCH_LIBDIR}/libtorch.so
                      ${MOEKIT_TORCH_LIBDIR}/libtorch_cpu.so ${MOEKIT_TORCH_LIBDIR}/libc10.so)

# NOTE: the whole build (not only the extension) uses torch's C++ ABI: libmoekit's API passes
# std::string (Status messages, names), which would not link across the two ABIs (torch wheels
# before 2.7 use the pre-C++11 one).
add_compile_definitions(_GLIBCXX_USE_CXX11_ABI=${_moekit_torch_abi})

if(NOT MOEKIT_TORCH_CUDA AND MOEKIT_CUDA STREQUAL "AUTO")
  message(STATUS "moekit: torch has no CUDA; building the CPU backends only")
  set(MOEKIT_CUDA OFF CACHE STRING "" FORCE)
endif()
