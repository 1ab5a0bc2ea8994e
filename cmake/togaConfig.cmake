# CMake package of toga for CUDA C++ (docs/cpp.md). It lives in <prefix>/lib/cmake/toga/ of a
# bundle that scripts/bundle-cpp makes:
#   <prefix>/include/toga.h, toga.cuh
#   <prefix>/lib/libtoga.a, libtoga.so          the C host API (toga's Rust host library)
#   <prefix>/lib/libtoga_device.a               toga_malloc & co., relocatable device code
#   <prefix>/lib/toga_device.ptx                the same as PTX, for other architectures
#
#   find_package(toga REQUIRED)                 # with CMAKE_PREFIX_PATH=<prefix>
#   add_executable(app main.cu)
#   target_link_libraries(app PRIVATE toga::toga)
#   set_target_properties(app PROPERTIES CUDA_SEPARABLE_COMPILATION ON)  # or toga_enable(app)
#
# toga::toga links the static host library; toga::toga_shared the shared one.
# Relocatable device code (-rdc) is a property of the target that links, not of a library, so
# the last line (or toga_enable(app), which does both) is needed once per executable.

include_guard(GLOBAL)
get_filename_component(_toga_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)

set(toga_INCLUDE_DIR "${_toga_prefix}/include")
set(toga_DEVICE_PTX "${_toga_prefix}/lib/toga_device.ptx")
foreach(_f include/toga.h include/toga.cuh lib/libtoga.a lib/libtoga_device.a)
  if(NOT EXISTS "${_toga_prefix}/${_f}")
    set(toga_FOUND FALSE)
    set(toga_NOT_FOUND_MESSAGE "toga: ${_toga_prefix}/${_f} is missing (run scripts/bundle-cpp)")
    return()
  endif()
endforeach()

find_package(Threads REQUIRED)

# The device functions, built for sm_75 to sm_120 (CUDA 13's range). For another
# architecture, make the object from toga_device.ptx:
#   nvcc -dc -maxrregcount=64 -arch=sm_XX toga_device.ptx -o toga_device.o
add_library(toga::device STATIC IMPORTED)
set_target_properties(toga::device PROPERTIES
  IMPORTED_LOCATION "${_toga_prefix}/lib/libtoga_device.a")

add_library(toga::host_static STATIC IMPORTED)
set_target_properties(toga::host_static PROPERTIES
  IMPORTED_LOCATION "${_toga_prefix}/lib/libtoga.a"
  INTERFACE_LINK_LIBRARIES "Threads::Threads;${CMAKE_DL_LIBS};m;rt")

add_library(toga::toga INTERFACE IMPORTED)
set_target_properties(toga::toga PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${toga_INCLUDE_DIR}"
  INTERFACE_LINK_LIBRARIES "toga::device;toga::host_static")

if(EXISTS "${_toga_prefix}/lib/libtoga.so")
  add_library(toga::host_shared SHARED IMPORTED)
  set_target_properties(toga::host_shared PROPERTIES
    IMPORTED_LOCATION "${_toga_prefix}/lib/libtoga.so"
    IMPORTED_NO_SONAME TRUE)
  add_library(toga::toga_shared INTERFACE IMPORTED)
  set_target_properties(toga::toga_shared PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${toga_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "toga::device;toga::host_shared")
endif()

# Link `target` with toga::toga and turn on relocatable device code for it.
function(toga_enable target)
  target_link_libraries(${target} PRIVATE toga::toga)
  set_target_properties(${target} PROPERTIES CUDA_SEPARABLE_COMPILATION ON)
endfunction()

set(toga_FOUND TRUE)
