// The backend-neutral AdamW types (AdamWConfig, LrSchedule, AdamWStepScalars,
// AdamWTensors, SimdLevel) as the ops layer names them. They live at the kernels' level
// (kernels/adamw_types.h) because the kernels that implement the ops use them too.
#pragma once

#include "peakbound/kernels/adamw_types.h"
