// Optimisers, parameter groups, gradient clipping and learning-rate schedules.
#pragma once
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/decay_groups.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "optim/sgd.h"
