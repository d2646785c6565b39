// Umbrella header: tensors, the differentiable op set, randomness, threads and device names, gradcheck.
#pragma once

#include "autograd/autograd.h"
#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "core/random.h"
#include "core/runtime.h"
#include "core/tensor.h"
