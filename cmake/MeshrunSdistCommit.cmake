# `python -m build --sdist` (scikit-build-core with sdist.cmake): writes the
# checkout's commit to packaging/sdist-commit, which the sdist carries
# (pyproject.toml's sdist.include) and cmake/MeshrunBuildInfo.cmake reads
# where there is no .git, so that a wheel built from the sdist names its
# commit in --version as one built from the checkout does.
set(_commit_file "${PROJECT_SOURCE_DIR}/packaging/sdist-commit")
execute_process(
  COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR} -DGIT_COMMIT=${MESHRUN_GIT_COMMIT}
          -DTEMPLATE=${PROJECT_SOURCE_DIR}/packaging/sdist-commit.in -DOUTPUT=${_commit_file}
          -DMESHRUN_VERSION=${PROJECT_VERSION} -P ${PROJECT_SOURCE_DIR}/cmake/MeshrunBuildInfo.cmake
  RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "meshrun: cannot write ${_commit_file}")
endif()
file(READ "${_commit_file}" _commit)
string(STRIP "${_commit}" _commit)
message(STATUS "meshrun: the sdist's commit: ${_commit}")
