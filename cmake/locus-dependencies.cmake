# Finds what locus needs and attaches it to a target. Used by the build tree and by
# the installed locus-config.cmake, so a consumer finds the same things.
#   LOCUS_ENABLE_CUDA: AUTO (CUDA when nvcc is found), ON (required) or OFF.
include_guard(GLOBAL)
include(CheckLanguage)

if(NOT DEFINED LOCUS_ENABLE_CUDA)
  set(LOCUS_ENABLE_CUDA AUTO)
endif()

set(LOCUS_CUDA_FOUND OFF)
if(LOCUS_CONSUMER)
  # Installed package: the CUDA choice was made when locus was installed; the consumer
  # enables the CUDA language itself if it has .cu files.
  if(LOCUS_ENABLE_CUDA STREQUAL "ON")
    find_package(CUDAToolkit REQUIRED)
    set(LOCUS_CUDA_FOUND ON)
  endif()
elseif(NOT LOCUS_ENABLE_CUDA STREQUAL "OFF")
  # nvcc on PATH or CUDAToolkit_ROOT
  if(NOT CMAKE_CUDA_COMPILER)
    if(DEFINED CUDAToolkit_ROOT AND EXISTS "${CUDAToolkit_ROOT}/bin/nvcc")
      set(CMAKE_CUDA_COMPILER "${CUDAToolkit_ROOT}/bin/nvcc")
    endif()
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    get_property(_locus_langs GLOBAL PROPERTY ENABLED_LANGUAGES)
    if(NOT "CUDA" IN_LIST _locus_langs)
      if(NOT CMAKE_CUDA_ARCHITECTURES)
        # Default: the GPU of this machine when one is visible, else a broad pair.
        set(CMAKE_CUDA_ARCHITECTURES native)
        execute_process(COMMAND nvidia-smi -L RESULT_VARIABLE _locus_smi OUTPUT_QUIET ERROR_QUIET)
        if(NOT _locus_smi EQUAL 0)
          set(CMAKE_CUDA_ARCHITECTURES 80 90)
        endif()
      endif()
      enable_language(CUDA)
    endif()
    find_package(CUDAToolkit REQUIRED)
    set(LOCUS_CUDA_FOUND ON)
  elseif(LOCUS_ENABLE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "locus: LOCUS_ENABLE_CUDA=ON but no nvcc was found; put nvcc on PATH, "
                        "set CUDAToolkit_ROOT, or configure with -DLOCUS_ENABLE_CUDA=OFF")
  endif()
endif()

# Thrust, CUB and libcu++ (CCCL): from the CUDA toolkit, or any CCCL on the prefix path.
if(LOCUS_CUDA_FOUND)
  find_package(CCCL CONFIG REQUIRED HINTS "${CUDAToolkit_LIBRARY_DIR}/cmake")
else()
  find_package(CUDAToolkit QUIET)
  set(_locus_cccl_hints "")
  if(CUDAToolkit_FOUND)
    set(_locus_cccl_hints "${CUDAToolkit_LIBRARY_DIR}/cmake")
  endif()
  find_package(CCCL CONFIG REQUIRED HINTS ${_locus_cccl_hints})
endif()

find_package(OpenMP)

function(locus_link_dependencies target)
  target_link_libraries(${target} INTERFACE CCCL::CCCL)
  if(OpenMP_CXX_FOUND)
    # nvcc passes OpenMP to its host compiler; link with it too.
    target_compile_options(${target} INTERFACE
      $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${OpenMP_CXX_FLAGS}>)
    target_link_libraries(${target} INTERFACE OpenMP::OpenMP_CXX)
  endif()
  if(LOCUS_CUDA_FOUND)
    target_compile_definitions(${target} INTERFACE LOCUS_ENABLE_CUDA=1)
    target_link_libraries(${target} INTERFACE CUDA::cudart)
    target_compile_options(${target} INTERFACE
      $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>
      $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
  else()
    target_compile_definitions(${target} INTERFACE LOCUS_ENABLE_CUDA=0)
  endif()
endfunction()
