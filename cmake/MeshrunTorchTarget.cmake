# meshrun_torch_target(NAME): an INTERFACE target NAME with what a program on
# libtorch and meshrun_worker needs. The build uses it (worker_lib/), and so
# does the installed package config (meshrunConfig.cmake), each with the
# libtorch that find_package(Torch) found there: Torch_DIR, TORCH_LIBRARIES
# (imported targets carrying libtorch's compile definitions: USE_DISTRIBUTED,
# USE_C10D_GLOO, and USE_C10D_NCCL on torch_cuda), TORCH_INCLUDE_DIRS and
# TORCH_CXX_FLAGS (e.g. -D_GLIBCXX_USE_CXX11_ABI=0 for a pre-cxx11-ABI
# libtorch: gRPC and absl must then have been built the same way, or linking
# fails). libtorch 2's headers need C++20.
function(meshrun_torch_target name)
  # The wheel ships ProcessGroupGloo.hpp but not the gloo/*.h it includes:
  # Debian's libgloo-dev provides them. The header holds Gloo's objects only
  # through pointers, so an older gloo's declarations do not change its layout.
  find_path(MESHRUN_GLOO_INCLUDE_DIR gloo/rendezvous/store.h)
  if(NOT MESHRUN_GLOO_INCLUDE_DIR)
    message(FATAL_ERROR "meshrun: Gloo's headers (gloo/rendezvous/store.h) not found: "
                        "install libgloo-dev (scripts/install-deps.sh does)")
  endif()
  # The CUDA wheel's own CUDA, NCCL and cuDNN (<site-packages>/nvidia/*/
  # {lib,include}, beside <site-packages>/torch/share/cmake/Torch):
  # libtorch_cuda finds the libraries at run time through its RPATH, but the
  # linker must be told, or it checks libtorch_cuda against the CUDA toolkit's
  # older NCCL; and c10d's headers must see the nccl.h libtorch was built with
  # (ProcessGroupNCCL's layout depends on the NCCL version), not the toolkit's.
  # Another libtorch has no such directories.
  get_filename_component(_site_packages "${Torch_DIR}/../../../.." ABSOLUTE)
  file(GLOB _nvidia_libs LIST_DIRECTORIES true "${_site_packages}/nvidia/*/lib")
  file(GLOB _nvidia_includes LIST_DIRECTORIES true "${_site_packages}/nvidia/*/include")

  add_library(${name} INTERFACE)
  # Before libtorch's own include directories, which name the CUDA toolkit's.
  target_include_directories(${name} SYSTEM BEFORE INTERFACE ${_nvidia_includes})
  target_link_libraries(${name} INTERFACE ${TORCH_LIBRARIES})
  target_include_directories(${name} SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS}
                             ${MESHRUN_GLOO_INCLUDE_DIR})
  target_compile_features(${name} INTERFACE cxx_std_20)
  # Link-time and run-time paths to the wheel's CUDA libraries first, so that
  # programs load the CUDA runtime and NCCL libtorch_cuda was built with
  # rather than the CUDA toolkit's.
  if(_nvidia_libs)
    list(JOIN _nvidia_libs ":" _nvidia_path)
    target_link_options(${name} INTERFACE "LINKER:-rpath-link,${_nvidia_path}"
                        "LINKER:-rpath,${_nvidia_path}")
  endif()
  # libtorch's release build is compiled with NDEBUG, and its headers are
  # not the same without it: RecordFunction has a debug-only member, and its
  # inline inputs() then asserts a flag the library never sets. Every
  # translation unit that includes them must see them as libtorch did, in
  # every build type, and none may define NDEBUG itself (an ODR violation
  # against the others). The release types' flags define it already (left
  # alone: the same command lines); Debug and no type get it here.
  target_compile_definitions(
    ${name} INTERFACE $<$<NOT:$<CONFIG:Release,RelWithDebInfo,MinSizeRel>>:NDEBUG>)
  separate_arguments(_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  target_compile_options(${name} INTERFACE ${_torch_flags})
endfunction()
