# Script mode (cmake -P), run at every build by rendezvous/status: writes
# OUTPUT from TEMPLATE with MESHRUN_VERSION and the git commit of SOURCE_DIR.
# configure_file rewrites OUTPUT only when its text changes, so a build
# recompiles it only when HEAD moves or the tree turns dirty or clean.
#
# The commit: GIT_COMMIT when given (-DMESHRUN_GIT_COMMIT=..., for a packager
# building from a tarball), else `git describe` of SOURCE_DIR (12 hex digits,
# "-dirty" with uncommitted changes to tracked files), else "unknown" (no
# .git, no git), where an sdist's packaging/sdist-commit names it
# (cmake/MeshrunSdistCommit.cmake).
if(GIT_COMMIT)
  set(MESHRUN_GIT_COMMIT "${GIT_COMMIT}")
else()
  set(MESHRUN_GIT_COMMIT "unknown")
  # Only SOURCE_DIR's own checkout: a tarball unpacked inside another git
  # tree is not that tree's commit.
  execute_process(COMMAND git -C "${SOURCE_DIR}" rev-parse --show-toplevel
                  OUTPUT_VARIABLE _top RESULT_VARIABLE _rc ERROR_QUIET
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  file(REAL_PATH "${SOURCE_DIR}" _source)
  if(_rc EQUAL 0 AND _top STREQUAL _source)
    # --exclude '*': the commit itself even where tags exist.
    execute_process(
      COMMAND git -C "${SOURCE_DIR}" describe --always --dirty --abbrev=12 --exclude "*"
      OUTPUT_VARIABLE _describe RESULT_VARIABLE _rc ERROR_QUIET
      OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(_rc EQUAL 0 AND NOT _describe STREQUAL "")
      set(MESHRUN_GIT_COMMIT "${_describe}")
    endif()
  elseif(EXISTS "${SOURCE_DIR}/packaging/sdist-commit")
    file(READ "${SOURCE_DIR}/packaging/sdist-commit" _recorded)
    string(STRIP "${_recorded}" _recorded)
    if(NOT _recorded STREQUAL "")
      set(MESHRUN_GIT_COMMIT "${_recorded}")
    endif()
  endif()
endif()
configure_file("${TEMPLATE}" "${OUTPUT}" @ONLY)
