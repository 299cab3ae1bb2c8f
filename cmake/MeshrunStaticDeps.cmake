# MESHRUN_STATIC_DEPS (issue 46): meshrun, meshrun-rdzvd and meshrun-slurm
# linked so that they run where none of the build's libraries are installed
# (the pip wheel's binaries): every imported library whose shared file has a
# static sibling in the same folder (libgrpc++.so.1.51 -> libgrpc++.a: gRPC,
# protobuf, absl, OpenSSL, c-ares, re2, upb, zlib on Debian) links that
# instead, spdlog and fmt (shared only on Debian) link a static build of
# their own compiled parts, and libstdc++ and libgcc are linked statically.
# What is left is glibc. The targets' dependency graph is the packages' own
# (their CMake configs list every library a static link needs), so only the
# files change. Nothing is compiled differently from a normal build, so a
# wheel build reuses a normal build's compiles through ccache.

# spdlog for meshrun's targets (MESHRUN_SPDLOG): the shared library, or
# meshrun_static_logging, compiled from Debian's spdlog and fmt headers
# with the shared libraries' own defines (cmake/static_deps/).
if(MESHRUN_STATIC_DEPS)
  add_library(meshrun_static_logging STATIC
              ${CMAKE_CURRENT_LIST_DIR}/static_deps/fmt_compiled.cc
              ${CMAKE_CURRENT_LIST_DIR}/static_deps/spdlog_compiled.cc)
  # The shared libraries' usage requirements, for their users and their own
  # compiled parts alike (SPDLOG_COMPILED_LIB, FMT_SHARED, ...).
  foreach(_imported spdlog::spdlog fmt::fmt)
    foreach(_property COMPILE_DEFINITIONS INCLUDE_DIRECTORIES COMPILE_OPTIONS)
      get_target_property(_value ${_imported} INTERFACE_${_property})
      if(_value)
        set_property(TARGET meshrun_static_logging APPEND PROPERTY ${_property} ${_value})
        set_property(TARGET meshrun_static_logging APPEND PROPERTY INTERFACE_${_property}
                                                                   ${_value})
      endif()
    endforeach()
  endforeach()
  target_link_libraries(meshrun_static_logging PUBLIC Threads::Threads)
  set(MESHRUN_SPDLOG meshrun_static_logging)
else()
  set(MESHRUN_SPDLOG spdlog::spdlog)
endif()

# The static file beside a shared library file, or "" when there is none.
function(_meshrun_static_sibling shared out)
  set(${out} "" PARENT_SCOPE)
  get_filename_component(dir "${shared}" DIRECTORY)
  get_filename_component(name "${shared}" NAME)
  # Two ifs: ${CMAKE_MATCH_1} in the same if() would be expanded before the match.
  if(name MATCHES "^(lib.+)\\.so(\\..*)?$")
    if(EXISTS "${dir}/${CMAKE_MATCH_1}.a")
      set(${out} "${dir}/${CMAKE_MATCH_1}.a" PARENT_SCOPE)
    endif()
  endif()
endfunction()

# An interface target's link items: a shared library's path, or a library
# by name (re2, -lre2), becomes the static file where there is one. Adds
# the count of items changed to the variable named by `count`.
function(_meshrun_static_interface target count)
  get_target_property(items ${target} INTERFACE_LINK_LIBRARIES)
  if(NOT items)
    return()
  endif()
  set(changed 0)
  set(result)
  foreach(item IN LISTS items)
    set(static "")
    if(IS_ABSOLUTE "${item}")
      _meshrun_static_sibling("${item}" static)
    else()
      # A library by name: "-lre2" or "re2" (not a target, not a flag).
      set(name "")
      if(item MATCHES "^-l([A-Za-z0-9_.+-]+)$")
        set(name ${CMAKE_MATCH_1})
      elseif(item MATCHES "^[A-Za-z0-9_.+][A-Za-z0-9_.+-]*$" AND NOT TARGET "${item}")
        set(name ${item})
      endif()
      # glibc's own libraries stay shared: a static piece of glibc in a
      # dynamic program breaks it.
      if(name AND NOT name MATCHES "^(c|m|dl|rt|pthread|util|resolv|anl|stdc\\+\\+|gcc_s)$")
        find_library(_meshrun_static_lib NAMES lib${name}.a NO_CACHE)
        if(_meshrun_static_lib)
          set(static "${_meshrun_static_lib}")
        endif()
        unset(_meshrun_static_lib)
      endif()
    endif()
    if(static)
      list(APPEND result "${static}")
      math(EXPR changed "${changed} + 1")
    else()
      list(APPEND result "${item}")
    endif()
  endforeach()
  set_property(TARGET ${target} PROPERTY INTERFACE_LINK_LIBRARIES "${result}")
  math(EXPR total "${${count}} + ${changed}")
  set(${count} ${total} PARENT_SCOPE)
endfunction()

# Points every imported library of this directory (the find_package calls
# of the top-level CMakeLists) at its static sibling, where it has one.
function(meshrun_prefer_static_imports)
  get_property(targets DIRECTORY PROPERTY IMPORTED_TARGETS)
  set(swapped 0)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(type STREQUAL "INTERFACE_LIBRARY")
      # pkg-config's (gRPC's re2::re2): libraries by name or by path.
      _meshrun_static_interface(${target} swapped)
      continue()
    endif()
    if(NOT type MATCHES "^(SHARED|UNKNOWN)_LIBRARY$")
      continue()
    endif()
    get_target_property(configs ${target} IMPORTED_CONFIGURATIONS)
    set(properties IMPORTED_LOCATION)
    if(configs)
      foreach(config IN LISTS configs)
        list(APPEND properties IMPORTED_LOCATION_${config})
      endforeach()
    endif()
    foreach(property IN LISTS properties)
      get_target_property(location ${target} ${property})
      if(location)
        _meshrun_static_sibling("${location}" static)
        if(static)
          set_property(TARGET ${target} PROPERTY ${property} "${static}")
          math(EXPR swapped "${swapped} + 1")
        endif()
      endif()
    endforeach()
  endforeach()
  # A static OpenSSL needs what its shared library brought along.
  if(TARGET OpenSSL::Crypto)
    set_property(TARGET OpenSSL::Crypto APPEND
                 PROPERTY INTERFACE_LINK_LIBRARIES ${CMAKE_DL_LIBS} Threads::Threads)
  endif()
  message(STATUS "meshrun: MESHRUN_STATIC_DEPS: ${swapped} imported libraries linked statically")
endfunction()
