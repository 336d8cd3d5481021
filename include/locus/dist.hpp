// <locus/dist.hpp>: data-parallel training over MPI (cpu, pinned) and NCCL (cuda).
// Link the CMake target locus::dist (MPI, and NCCL where CUDA is enabled). The core
// headers never include MPI or NCCL.
#pragma once

#include "dist/communicator.hpp"
#include "dist/data_parallel.hpp"
