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
        # Default: the GPU of this machine when one is visible. Without one the build is a
        # compile check: PTX for one architecture and no machine code (ptxas was a third
        # of each nvcc translation unit's time); a GPU of compute capability 9.0 or later
        # would JIT it. Set CMAKE_CUDA_ARCHITECTURES to build for a GPU elsewhere.
        set(CMAKE_CUDA_ARCHITECTURES native)
        execute_process(COMMAND nvidia-smi -L RESULT_VARIABLE _locus_smi OUTPUT_QUIET ERROR_QUIET)
        if(NOT _locus_smi EQUAL 0)
          set(CMAKE_CUDA_ARCHITECTURES 90-virtual)
        endif()
      endif()
      enable_language(CUDA)
    endif()
    find_package(CUDAToolkit REQUIRED)
    set(LOCUS_CUDA_FOUND ON)
    # No GPU visible (asked at every configure): locus's own test targets for cuda are
    # compiled here, never run, and may take the cheaper path (tests/CMakeLists.txt).
    execute_process(COMMAND nvidia-smi -L RESULT_VARIABLE _locus_smi OUTPUT_QUIET ERROR_QUIET)
    if(NOT _locus_smi EQUAL 0)
      set(LOCUS_CUDA_COMPILE_CHECK ON)
    endif()
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

# BLAS for host GEMMs (locus::matmul on cpu and pinned): OpenBLAS when it is there, else
# any BLAS FindBLAS knows, provided it has the CBLAS interface (cblas.h and
# cblas_sgemm). Without one locus runs its own blocked GEMM, correct but slower.
#   LOCUS_ENABLE_BLAS: AUTO (default: use BLAS when found), ON (required) or OFF.
# The result is the imported target locus::blas (BLAS::BLAS, the cblas.h directory and
# LOCUS_HAS_BLAS=1). The installed package links it through $<TARGET_NAME_IF_EXISTS>,
# so a consumer whose machine has no BLAS still configures (and uses the fallback).
if(NOT DEFINED LOCUS_ENABLE_BLAS)
  set(LOCUS_ENABLE_BLAS AUTO)
endif()
set(LOCUS_BLAS_FOUND OFF)
# OpenBLAS's OpenMP build comes first when OpenMP is on: it shares libgomp's thread
# pool with locus's kernels. The pthreads build keeps its own threads, and on a small
# machine locus's OpenMP threads (spinning after each kernel) and OpenBLAS's threads
# then fight for the cores: measured here, a training step ran 3x slower.
if(NOT LOCUS_ENABLE_BLAS STREQUAL "OFF" AND NOT TARGET locus::blas AND OpenMP_CXX_FOUND
   AND NOT DEFINED BLA_VENDOR)
  find_library(LOCUS_OPENBLAS_OPENMP NAMES openblas
               PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp NO_DEFAULT_PATH)
  find_path(LOCUS_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas)
  if(LOCUS_OPENBLAS_OPENMP AND LOCUS_CBLAS_INCLUDE_DIR)
    add_library(locus::blas INTERFACE IMPORTED)
    target_link_libraries(locus::blas INTERFACE "${LOCUS_OPENBLAS_OPENMP}")
    target_include_directories(locus::blas INTERFACE "${LOCUS_CBLAS_INCLUDE_DIR}")
    target_compile_definitions(locus::blas INTERFACE LOCUS_HAS_BLAS=1)
    set(LOCUS_BLAS_FOUND ON)
    message(STATUS "locus: host GEMMs through OpenBLAS, OpenMP build (${LOCUS_OPENBLAS_OPENMP})")
  endif()
endif()
if(NOT LOCUS_ENABLE_BLAS STREQUAL "OFF" AND NOT TARGET locus::blas)
  if(NOT DEFINED BLA_VENDOR)
    set(BLA_VENDOR OpenBLAS)
    find_package(BLAS QUIET)
    unset(BLA_VENDOR)
    if(NOT BLAS_FOUND)
      find_package(BLAS QUIET)
    endif()
  else()
    find_package(BLAS QUIET)
  endif()
  find_path(LOCUS_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas)
  if(BLAS_FOUND AND LOCUS_CBLAS_INCLUDE_DIR)
    include(CheckCXXSourceCompiles)
    include(CMakePushCheckState)
    cmake_push_check_state(RESET)
    set(CMAKE_REQUIRED_INCLUDES "${LOCUS_CBLAS_INCLUDE_DIR}")
    set(CMAKE_REQUIRED_LIBRARIES ${BLAS_LIBRARIES})
    set(CMAKE_REQUIRED_QUIET ON)
    check_cxx_source_compiles([=[
      #include <cblas.h>
      int main() {
        float a = 1, b = 2, c = 0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1);
        return c == 2 ? 0 : 1;
      }]=] LOCUS_CBLAS_LINKS)
    cmake_pop_check_state()
    if(LOCUS_CBLAS_LINKS)
      set(LOCUS_BLAS_FOUND ON)
      add_library(locus::blas INTERFACE IMPORTED)
      target_link_libraries(locus::blas INTERFACE BLAS::BLAS)
      target_include_directories(locus::blas INTERFACE "${LOCUS_CBLAS_INCLUDE_DIR}")
      target_compile_definitions(locus::blas INTERFACE LOCUS_HAS_BLAS=1)
    endif()
  endif()
  if(NOT LOCUS_BLAS_FOUND)
    if(LOCUS_ENABLE_BLAS STREQUAL "ON")
      message(FATAL_ERROR "locus: LOCUS_ENABLE_BLAS=ON but no BLAS with a CBLAS interface was "
                          "found; install OpenBLAS (Debian: libopenblas-dev), set BLA_VENDOR, or "
                          "configure with -DLOCUS_ENABLE_BLAS=OFF")
    endif()
    message(STATUS "locus: no BLAS with cblas.h found; host matmul uses locus's blocked GEMM "
                   "(install libopenblas-dev for speed)")
  else()
    message(STATUS "locus: host GEMMs through BLAS (${BLAS_LIBRARIES})")
  endif()
elseif(TARGET locus::blas)
  set(LOCUS_BLAS_FOUND ON)
endif()

# oneDNN for f32 host GEMMs (dnnl_sgemm): on the training step's shapes it beat
# OpenBLAS by 10-40% here (bench/RESULTS.md), so it is the default library when found;
# locus::set_host_gemm or LOCUS_HOST_GEMM picks another at run time. Only a oneDNN built
# on OpenMP is used (Debian's libdnnl-dev is): its threads are libgomp's, shared with
# locus's kernels and OpenBLAS, so no two thread pools fight for the cores.
#   LOCUS_ENABLE_ONEDNN: AUTO (default: use it when found), ON (required) or OFF.
# The result is the imported target locus::onednn (the library, its include directory
# and LOCUS_HAS_ONEDNN=1), linked like locus::blas.
if(NOT DEFINED LOCUS_ENABLE_ONEDNN)
  set(LOCUS_ENABLE_ONEDNN AUTO)
endif()
if(NOT LOCUS_ENABLE_ONEDNN STREQUAL "OFF" AND NOT TARGET locus::onednn)
  find_library(LOCUS_ONEDNN_LIBRARY NAMES dnnl)
  find_path(LOCUS_ONEDNN_INCLUDE_DIR oneapi/dnnl/dnnl.h)
  set(_locus_onednn_omp OFF)
  # AUTO takes oneDNN on x86-64 only (its JIT GEMMs are x86-64 kernels; elsewhere its
  # sgemm is a reference loop), and only with libgomp (a oneDNN on GNU OpenMP beside
  # clang's libomp would be two OpenMP runtimes in one process).
  set(_locus_onednn_arch ON)
  if(LOCUS_ENABLE_ONEDNN STREQUAL "AUTO" AND NOT CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
    set(_locus_onednn_arch OFF)
  endif()
  if(LOCUS_ONEDNN_LIBRARY AND LOCUS_ONEDNN_INCLUDE_DIR AND OpenMP_CXX_FOUND AND _locus_onednn_arch
     AND "gomp" IN_LIST OpenMP_CXX_LIB_NAMES
     AND EXISTS "${LOCUS_ONEDNN_INCLUDE_DIR}/oneapi/dnnl/dnnl_config.h")
    file(STRINGS "${LOCUS_ONEDNN_INCLUDE_DIR}/oneapi/dnnl/dnnl_config.h" _locus_onednn_runtime
         REGEX "^#define DNNL_CPU_RUNTIME ")
    if(_locus_onednn_runtime MATCHES "DNNL_RUNTIME_OMP")
      set(_locus_onednn_omp ON)
    endif()
  endif()
  if(_locus_onednn_omp)
    add_library(locus::onednn INTERFACE IMPORTED)
    target_link_libraries(locus::onednn INTERFACE "${LOCUS_ONEDNN_LIBRARY}")
    target_include_directories(locus::onednn INTERFACE "${LOCUS_ONEDNN_INCLUDE_DIR}")
    target_compile_definitions(locus::onednn INTERFACE LOCUS_HAS_ONEDNN=1)
    message(STATUS "locus: f32 host GEMMs through oneDNN (${LOCUS_ONEDNN_LIBRARY})")
  elseif(LOCUS_ENABLE_ONEDNN STREQUAL "ON")
    message(FATAL_ERROR "locus: LOCUS_ENABLE_ONEDNN=ON but no oneDNN built on GNU OpenMP was found (with OpenMP "
                        "enabled, libgomp); install it (Debian: libdnnl-dev) or configure with "
                        "-DLOCUS_ENABLE_ONEDNN=OFF")
  else()
    message(STATUS "locus: oneDNN not used for f32 host GEMMs (not found, not x86-64, or not on libgomp; "
                   "Debian: libdnnl-dev)")
  endif()
endif()

# zlib for the IDX dataset reader (locus/data/idx.hpp reads plain and gzip files). The
# imported target locus::zlib carries LOCUS_HAS_ZLIB=1; linked like locus::blas.
if(NOT TARGET locus::zlib)
  find_package(ZLIB QUIET)
  if(ZLIB_FOUND)
    add_library(locus::zlib INTERFACE IMPORTED)
    target_link_libraries(locus::zlib INTERFACE ZLIB::ZLIB)
    target_compile_definitions(locus::zlib INTERFACE LOCUS_HAS_ZLIB=1)
  else()
    message(STATUS "locus: zlib not found; locus/data (IDX datasets) is unavailable "
                   "(Debian: zlib1g-dev)")
  endif()
endif()

# nlohmann-json for safetensors checkpoints (locus/io/safetensors.hpp, locus/train.hpp).
# The imported target locus::json carries LOCUS_HAS_JSON=1; linked like locus::zlib.
if(NOT TARGET locus::json)
  find_package(nlohmann_json 3 QUIET)
  if(nlohmann_json_FOUND)
    add_library(locus::json INTERFACE IMPORTED)
    target_link_libraries(locus::json INTERFACE nlohmann_json::nlohmann_json)
    target_compile_definitions(locus::json INTERFACE LOCUS_HAS_JSON=1)
  else()
    message(STATUS "locus: nlohmann-json not found; checkpoints (locus/io/safetensors.hpp) "
                   "are unavailable (Debian: nlohmann-json3-dev)")
  endif()
endif()

# MPI for <locus/dist.hpp> (data-parallel training; never linked into locus::locus).
#   LOCUS_ENABLE_MPI: AUTO (default: use it when found), ON (required) or OFF.
# The result is the imported target locus::mpi (MPI's C library, LOCUS_HAS_MPI=1) and,
# with CUDA, locus::nccl (the toolkit's NCCL, LOCUS_HAS_NCCL=1); locus::dist links them.
# Without MPI, locus::dist still builds: a world of one (NCCL included), and a program
# started by a launcher refuses to run.
if(NOT DEFINED LOCUS_ENABLE_MPI)
  set(LOCUS_ENABLE_MPI AUTO)
endif()
if(NOT LOCUS_ENABLE_MPI STREQUAL "OFF" AND NOT TARGET locus::mpi)
  # MPI's C API through the C++ compiler (the project enables CXX only); without the
  # deprecated C++ bindings.
  set(MPI_CXX_SKIP_MPICXX TRUE)
  find_package(MPI QUIET COMPONENTS CXX)
  if(MPI_CXX_FOUND)
    add_library(locus::mpi INTERFACE IMPORTED)
    target_link_libraries(locus::mpi INTERFACE MPI::MPI_CXX)
    target_compile_definitions(locus::mpi INTERFACE LOCUS_HAS_MPI=1)
    message(STATUS "locus: data-parallel training (locus::dist) over MPI ${MPI_CXX_VERSION}")
  elseif(LOCUS_ENABLE_MPI STREQUAL "ON")
    message(FATAL_ERROR "locus: LOCUS_ENABLE_MPI=ON but no MPI was found (Debian: openmpi-bin libopenmpi-dev), "
                        "or configure with -DLOCUS_ENABLE_MPI=OFF")
  else()
    message(STATUS "locus: MPI not found; locus::dist runs a world of one only "
                   "(Debian: openmpi-bin libopenmpi-dev)")
  endif()
endif()
if(LOCUS_CUDA_FOUND AND NOT TARGET locus::nccl)
  find_library(LOCUS_NCCL_LIBRARY NAMES nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  find_path(LOCUS_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  if(LOCUS_NCCL_LIBRARY AND LOCUS_NCCL_INCLUDE_DIR)
    add_library(locus::nccl INTERFACE IMPORTED)
    target_link_libraries(locus::nccl INTERFACE "${LOCUS_NCCL_LIBRARY}")
    target_include_directories(locus::nccl INTERFACE "${LOCUS_NCCL_INCLUDE_DIR}")
    target_compile_definitions(locus::nccl INTERFACE LOCUS_HAS_NCCL=1)
  else()
    message(STATUS "locus: NCCL not found; communicator<cuda> is unavailable")
  endif()
endif()

function(locus_link_dependencies target)
  target_link_libraries(${target} INTERFACE CCCL::CCCL)
  if(OpenMP_CXX_FOUND)
    # nvcc passes OpenMP to its host compiler; link with it too.
    target_compile_options(${target} INTERFACE
      $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${OpenMP_CXX_FLAGS}>)
    target_link_libraries(${target} INTERFACE OpenMP::OpenMP_CXX)
  endif()
  # Exported as written: the consumer's locus-dependencies.cmake decides whether it exists.
  target_link_libraries(${target} INTERFACE $<TARGET_NAME_IF_EXISTS:locus::blas>
                                            $<TARGET_NAME_IF_EXISTS:locus::onednn>
                                            $<TARGET_NAME_IF_EXISTS:locus::zlib>
                                            $<TARGET_NAME_IF_EXISTS:locus::json>)
  if(LOCUS_CUDA_FOUND)
    target_compile_definitions(${target} INTERFACE LOCUS_ENABLE_CUDA=1)
    target_link_libraries(${target} INTERFACE CUDA::cudart CUDA::cublasLt)
    target_compile_options(${target} INTERFACE
      $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>
      # "pointless comparison of unsigned integer with zero": loops over a rank R that
      # is 0 for rank-0 tensors; correct code, and the warning buries real ones.
      $<$<COMPILE_LANGUAGE:CUDA>:--diag-suppress=186>
      $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
  else()
    target_compile_definitions(${target} INTERFACE LOCUS_ENABLE_CUDA=0)
  endif()
endfunction()
