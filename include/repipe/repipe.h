/*
** repipe: replicated, pipelined training and inference of neural networks.
** This header includes every public module.
*/
#ifndef REPIPE_H
#define REPIPE_H

#include "repipe/checkpoint.h"
#include "repipe/comm.h"
#include "repipe/config.h"
#include "repipe/core.h"
#include "repipe/grouping.h"
#include "repipe/layers.h"
#include "repipe/net.h"
#include "repipe/planner.h"
#include "repipe/profile.h"
#include "repipe/spec.h"
#include "repipe/data.h"
#include "repipe/device.h"
#include "repipe/transformer.h"
#include "repipe/session.h"
#include "repipe/schedule.h"
#include "repipe/simulate.h"
#include "repipe/weights.h"

#endif /* REPIPE_H */
