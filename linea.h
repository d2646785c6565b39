// Umbrella header: everything a program built on Linea uses — tensors, the differentiable op
// set, randomness, threads and device names, gradcheck (core/, autograd/), modules, layers,
// losses, optimizers, schedules, checkpoints and data (nn/), and the attention mechanisms with
// the layers built on them (attention/). Include single headers instead to keep a translation
// unit lean.
#pragma once

#include "attention/registry.h"
#include "attention/transformer.h"
#include "autograd/autograd.h"
#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "core/random.h"
#include "core/runtime.h"
#include "core/tensor.h"
#include "nn/checkpoint.h"
#include "nn/data.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/loss.h"
#include "nn/module.h"
#include "nn/optim.h"
#include "nn/readers.h"
#include "nn/safetensors.h"
#include "nn/sampler.h"
#include "nn/schedule.h"
