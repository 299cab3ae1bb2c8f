# The project's one torch: the pinned wheel in the project's virtualenv
# (scripts/install-deps.sh). Sets, in the caller's scope:
#   MESHRUN_PYTHON        the venv's python3 (tests and benchmarks run Python
#                         workers and torchrun with it)
#   MESHRUN_TORCHRUN      its torchrun, the peer of tests and benchmarks
#   MESHRUN_TORCH_VERSION torch's version, e.g. 2.15.0+cu132
# and puts the wheel's CMake config on CMAKE_PREFIX_PATH for find_package(Torch).
#
# Another torch: -DMESHRUN_PYTHON=/path/to/bin/python3 (any PyTorch 2 there is
# used, with a warning when it is not the pinned release), or Torch_DIR for
# the C++ worker library alone. A missing venv or a venv with another torch
# stops the configure with one line saying what was found and how to install.

set(MESHRUN_VENV "${PROJECT_SOURCE_DIR}/.venv" CACHE PATH
    "The project's Python virtualenv (made by scripts/install-deps.sh)")
set(MESHRUN_PYTHON "${MESHRUN_VENV}/bin/python3" CACHE FILEPATH
    "Python with PyTorch 2: runs Python workers, torchrun and the benchmarks")

file(STRINGS "${PROJECT_SOURCE_DIR}/scripts/python-requirements.txt" _meshrun_pin
     REGEX "^torch==")
string(REPLACE "torch==" "" MESHRUN_TORCH_PINNED "${_meshrun_pin}")

set(_meshrun_install_hint "run 'bash scripts/install-deps.sh' or pass -DMESHRUN_PYTHON=<python with torch 2>")
if(NOT EXISTS "${MESHRUN_PYTHON}")
  message(FATAL_ERROR "meshrun: no Python at ${MESHRUN_PYTHON}: ${_meshrun_install_hint}")
endif()
execute_process(
  COMMAND "${MESHRUN_PYTHON}" -c
          "import torch, torch.utils; print(torch.__version__); print(torch.utils.cmake_prefix_path)"
  OUTPUT_VARIABLE _meshrun_torch_out ERROR_QUIET RESULT_VARIABLE _meshrun_torch_rc
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _meshrun_torch_rc EQUAL 0)
  message(FATAL_ERROR "meshrun: ${MESHRUN_PYTHON} cannot import torch: ${_meshrun_install_hint}")
endif()
string(REPLACE "\n" ";" _meshrun_torch_out "${_meshrun_torch_out}")
list(GET _meshrun_torch_out 0 MESHRUN_TORCH_VERSION)
list(GET _meshrun_torch_out 1 _meshrun_torch_cmake)
string(REGEX REPLACE "\\+.*" "" _meshrun_torch_release "${MESHRUN_TORCH_VERSION}")
if(NOT _meshrun_torch_release STREQUAL MESHRUN_TORCH_PINNED)
  if(MESHRUN_PYTHON STREQUAL "${MESHRUN_VENV}/bin/python3")
    message(FATAL_ERROR "meshrun: ${MESHRUN_VENV} has torch ${MESHRUN_TORCH_VERSION}, the "
                        "project pins ${MESHRUN_TORCH_PINNED}: run 'bash scripts/install-deps.sh'")
  endif()
  if(_meshrun_torch_release VERSION_LESS 2.0)
    message(FATAL_ERROR "meshrun: ${MESHRUN_PYTHON} has torch ${MESHRUN_TORCH_VERSION}; "
                        "meshrun needs PyTorch 2")
  endif()
  message(WARNING "meshrun: using torch ${MESHRUN_TORCH_VERSION} from ${MESHRUN_PYTHON}; "
                  "tested with ${MESHRUN_TORCH_PINNED}")
endif()
get_filename_component(_meshrun_python_dir "${MESHRUN_PYTHON}" DIRECTORY)
set(MESHRUN_TORCHRUN "${_meshrun_python_dir}/torchrun")
list(APPEND CMAKE_PREFIX_PATH "${_meshrun_torch_cmake}")
message(STATUS "meshrun: torch ${MESHRUN_TORCH_VERSION} from ${MESHRUN_PYTHON}")
