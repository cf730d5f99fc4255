// Every nn header: modules, layers, initialisation, sparse probability maps, μMoE
// layers and blocks, expert analysis, and the top-K and product-key MLP approximations.
#pragma once
#include "nn/activation.h"
#include "nn/embedding.h"
#include "nn/entmax.h"
#include "nn/expert_analysis.h"
#include "nn/init.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/mumoe_block.h"
#include "nn/mumoe_layer.h"
#include "nn/norm.h"
#include "nn/pkm.h"
#include "nn/sparse_moe.h"
#include "nn/topk_mlp.h"
