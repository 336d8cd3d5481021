// locus/train.hpp: training on top of locus.hpp. Precision policies and dynamic loss
// scaling (locus::amp), layers, sequential models and losses (locus::nn), optimizers and
// learning-rate schedules (locus::optim), the trainer and safetensors checkpoints
// (locus::train, locus::io). Kept out of locus.hpp so that files which only compute
// do not pay for it in compile time; checkpoints need nlohmann-json (locus::json).
#pragma once

#include "locus.hpp"

#include "amp/grad_scaler.hpp"
#include "amp/policy.hpp"
#include "nn/layers.hpp"
#include "nn/conv.hpp"
#include "nn/loss.hpp"
#include "nn/parameters.hpp"
#include "optim/optim.hpp"
#include "train/trainer.hpp"

#if defined(LOCUS_HAS_JSON) && LOCUS_HAS_JSON
#include "io/safetensors.hpp"
#include "nn/serialize.hpp"
#include "train/checkpoint.hpp"
#endif
