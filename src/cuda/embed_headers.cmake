# Embeds the headers a compiled-mods module includes (src/cuda/cuda_flex_jit.h) into a C++
# source, for NVRTC, which is handed them by name. Run at build time:
#   cmake -DSRC=<src dir> -DOUT=<file.cpp> -P embed_headers.cmake
if(NOT SRC OR NOT OUT)
  message(FATAL_ERROR "embed_headers.cmake: -DSRC=<src dir> -DOUT=<file.cpp> are required")
endif()
set(body "/* generated from the src/cuda headers by src/cuda/embed_headers.cmake: do not edit */\n")
string(APPEND body "#include \"cuda/cuda_flex_jit.h\"\n")
foreach(pair "cuda_flex_kernels.cuh:ctcu_text_flex_kernels_cuh" "cuda_attn_common.cuh:ctcu_text_attn_common_cuh")
  string(REPLACE ":" ";" pair "${pair}")
  list(GET pair 0 file)
  list(GET pair 1 var)
  file(READ "${SRC}/cuda/${file}" text HEX)
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," text "${text}")
  string(APPEND body "extern \"C\" const char ${var}[] = {${text}0};\n")
endforeach()
file(WRITE "${OUT}.tmp" "${body}")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
