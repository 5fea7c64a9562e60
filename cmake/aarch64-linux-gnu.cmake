# Cross-compiling ctorch for AArch64 Linux with Debian's gcc-aarch64-linux-gnu.
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
# The arm64 libraries (jansson, libcrypto, OpenBLAS) come from Debian multiarch
# (dpkg --add-architecture arm64; scripts/test-aarch64.sh installs them). Tests run under
# qemu-aarch64 (CMAKE_CROSSCOMPILING_EMULATOR; QEMU_CPU picks the CPU model, e.g.
# max,sve-default-vector-length=32). Leave QEMU_LD_PREFIX unset: the multiarch loader
# /lib/ld-linux-aarch64.so.1 matches the multiarch libc (see scripts/test-aarch64.sh).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
find_program(CT_AARCH64_CXX aarch64-linux-gnu-g++)
if(CT_AARCH64_CXX)
  set(CMAKE_CXX_COMPILER ${CT_AARCH64_CXX})
endif()
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /usr/lib/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# pkg-config answers with the arm64 .pc files only.
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_SYSROOT_DIR} "")
find_program(CT_QEMU_AARCH64 qemu-aarch64)
if(CT_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${CT_QEMU_AARCH64})
endif()
# MPI is not cross-built (the comm suite is not run under qemu).
set(CTORCH_MPI OFF CACHE BOOL "Build the MPI backend of the communication layer")
