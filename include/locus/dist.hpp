// <locus/dist.hpp>: data-parallel training over MPI (cpu, pinned) and NCCL (cuda).
// Link the CMake target locus::dist (MPI, and NCCL where CUDA is enabled). The core
// headers never include MPI or NCCL. nlohmann-json (LOCUS_HAS_JSON) is needed only by a
// program that saves checkpoints: without it everything else compiles, and a call of
// data_parallel::save_checkpoint is a locus: error saying what to install.
#pragma once

#include "dist/communicator.hpp"
#include "dist/data_parallel.hpp"
