// The world communicator shared by all mpi-labelled tests (defined in mpi_main.cc).
#pragma once

#include "peakbound/comm/communicator.h"

namespace peakbound::testing {
Communicator& world();
}
