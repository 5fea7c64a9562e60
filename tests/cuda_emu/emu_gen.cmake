# The emulated CUDA device (tests only): turns one src/cuda/*.cu file into C++ for the host
# compiler with tests/cuda_emu/cuda_runtime.h. Run at build time:
#   cmake -DIN=<file.cu> -DOUT=<file.cpp> -P emu_gen.cmake
# Rewrites (see cuda_runtime.h):
#   name<<<cfg>>>(args), name<T...><<<cfg>>>(args) (over several lines too)
#                               -> emu_kernel(name)[emu_cfg(cfg)](args)
#   extern __shared__ T name[]; -> T *name = (T *)emu_dyn_shared();
#   __shared__ T name[...];     -> static T name[...]; emu_shared(&name, sizeof name);
# and stops with an error if any <<<, >>> or __shared__ is left, so a construct it does not
# know never compiles into something else. A #line directive keeps the .cu's file and lines
# in the compiler's messages.
if(NOT IN OR NOT OUT)
  message(FATAL_ERROR "emu_gen.cmake: -DIN=<file.cu> -DOUT=<file.cpp> are required")
endif()
file(READ "${IN}" text)

set(id "[A-Za-z_][A-Za-z0-9_]*")
string(REGEX REPLACE
  "extern[ \t\r\n]+__shared__[ \t\r\n]+([A-Za-z_][A-Za-z0-9_ ]*[A-Za-z0-9_])[ \t\r\n]+(${id})[ \t]*\\[[ \t]*\\][ \t]*;"
  "\\1 *\\2 = (\\1 *)emu_dyn_shared();" text "${text}")
string(REGEX REPLACE
  "__shared__[ \t\r\n]+(${id})[ \t\r\n]+(${id})([^;]*);"
  "static \\1 \\2\\3; emu_shared(&\\2, sizeof \\2);" text "${text}")
string(REGEX REPLACE
  "(${id}(<[^<>;{}()]*>)?)[ \t\r\n]*<<<"
  "emu_kernel(\\1)[emu_cfg(" text "${text}")
string(REPLACE ">>>" ")]" text "${text}")

foreach(left "<<<" "__shared__")
  string(FIND "${text}" "${left}" at)
  if(NOT at EQUAL -1)
    string(SUBSTRING "${text}" ${at} 120 ctx)
    message(FATAL_ERROR "emu_gen.cmake: ${IN}: '${left}' left after the rewrite, at: ${ctx}")
  endif()
endforeach()

file(WRITE "${OUT}.tmp" "/* generated from ${IN} by tests/cuda_emu/emu_gen.cmake: do not edit */\n#line 1 \"${IN}\"\n${text}")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
