# install(SCRIPT) of component "launcher": the systemd unit and its settings
# file, written for the prefix installed to (the Debian package's /usr, or
# cmake --install --prefix), which is known only at install time. ExecStart
# names the installed daemon; configuration goes to /etc for the prefix /usr
# and to PREFIX/etc otherwise, as GNUInstallDirs places it. file(INSTALL)
# adds DESTDIR itself (CPack stages the package there).
# Set before: MESHRUN_PACKAGING_DIR, MESHRUN_PACKAGING_BINARY_DIR, MESHRUN_BINDIR_REL.
set(_prefix "${CMAKE_INSTALL_PREFIX}")
if(_prefix STREQUAL "/usr")
  set(MESHRUN_ETC "/etc")
else()
  set(MESHRUN_ETC "${_prefix}/etc")
endif()
set(MESHRUN_BINDIR "${_prefix}/${MESHRUN_BINDIR_REL}")
# One staging copy per destination: installs may run side by side (tests).
string(MD5 _staging "$ENV{DESTDIR}${_prefix}")
set(_staging "${MESHRUN_PACKAGING_BINARY_DIR}/unit-${_staging}")
configure_file("${MESHRUN_PACKAGING_DIR}/meshrun-rdzvd.service.in"
               "${_staging}/meshrun-rdzvd.service" @ONLY)
file(INSTALL "${_staging}/meshrun-rdzvd.service"
     DESTINATION "${_prefix}/lib/systemd/system")
file(INSTALL "${MESHRUN_PACKAGING_DIR}/meshrun-rdzvd.default"
     DESTINATION "${MESHRUN_ETC}/default" RENAME meshrun-rdzvd)
