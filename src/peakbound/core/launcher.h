// What the launcher (mpirun, srun) tells this process through its environment, readable
// before MPI starts: its rank and the job's size, and how many ranks share this node.
// and this process's rank among them (its local rank, which picks its GPU).
// Each is 0, 1, 1 and 0 when no launcher started the process (or a variable is malformed).
#pragma once

namespace peakbound {

int launcher_rank();
int launcher_size();
int launcher_local_size();
int launcher_local_rank();

}  // namespace peakbound
