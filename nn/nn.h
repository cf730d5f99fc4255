// Every nn header: modules, layers and initialisation.
#pragma once
#include "nn/activation.h"
#include "nn/embedding.h"
#include "nn/init.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/norm.h"
