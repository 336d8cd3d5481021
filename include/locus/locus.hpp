// The umbrella header: everything locus offers.
#pragma once

#include "core/config.hpp"
#include "core/half.hpp"
#include "core/dtype.hpp"
#include "core/device.hpp"
#include "core/error.hpp"
#include "core/shape.hpp"
#include "core/rules.hpp"
#include "memory/allocator.hpp"
#include "core/environment.hpp"
#include "core/with_device.hpp"
#include "tensor/tensor.hpp"
#include "transfer/copy.hpp"
#include "tensor/factories.hpp"
#include "ops/math.hpp"
#include "ops/expr.hpp"
