// agree(): runs a step of setup that may fail on some ranks and not others (a file only
// one rank reads, a device budget one rank's share exceeds), and turns a failure on any
// rank into the same AgreedError on every rank, so the job ends with one line (printed
// by rank 0) instead of one rank's MPI_Abort and a line per rank.
//
// The step must not itself communicate with ranks outside this call's agreement: if
// rank 1 fails half-way while rank 0 waits in a collective inside `step`, the job hangs.
// Use it around local work (reading files, allocating, checking), then communicate.
#pragma once

#include <functional>

#include "peakbound/comm/communicator.h"

namespace peakbound {

// Collective over `world`. A peakbound::Error (or std::bad_alloc) thrown by `step` on any
// rank becomes AgreedError on every rank, carrying the message of the lowest failing
// rank, prefixed with "rank R: " when that rank is not 0 and the world has several.
// An error that is already an AgreedError is passed on the same way.
void agree(Communicator& world, const std::function<void()>& step);

}  // namespace peakbound
