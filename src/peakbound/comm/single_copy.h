// Whether MPI's shared-memory transport can move a large message in one copy here.
//
// OpenMPI's shared-memory BTL (vader) moves a message above its eager limit either in one
// copy, the receiver reading the sender's buffer with process_vm_readv (Linux cross-memory
// attach, "cma"), or, with the mechanism "none", in fragments through shared FIFOs that
// advance only while BOTH ranks are inside MPI calls. A transfer posted before a kernel
// (a ring's next hop) then does not move while the sender computes: the receiver's wait
// lasts until the sender's next MPI call, and overlap is lost (`bench attention` at CP 2
// on 2 ranks, 1 core each: overlap 0 with "none", 0.76-0.86 with "cma" over 4 runs).
//
// cma needs the kernel to let one rank read another's memory: containers whose seccomp
// profile or ptrace policy (Yama) forbids process_vm_readv make OpenMPI fail at the first
// large message, which is why launchers set "none" blindly. The probe instead forks a
// child that allows any tracer (PR_SET_PTRACER_ANY, as OpenMPI's ranks do) and reads its
// memory with process_vm_readv; it runs once per process (the result is cached).
#pragma once

#include <string>

namespace peakbound {

// True where process_vm_readv between two of this user's processes works: the first
// call's probe, cached.
bool cross_memory_attach_works();

// The probe itself, uncached (forks once; tests call it under a seccomp filter).
bool probe_cross_memory_attach();

// The value for OMPI_MCA_btl_vader_single_copy_mechanism this machine allows: "cma"
// where the probe passes, else "none".
std::string mpi_single_copy_mechanism();

}  // namespace peakbound
