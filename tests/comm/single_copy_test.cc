#include "peakbound/comm/single_copy.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstddef>

#if defined(__linux__) && defined(__x86_64__)
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#endif

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

TEST(SingleCopy, TheMechanismFollowsTheProbe) {
  const bool works = cross_memory_attach_works();
  EXPECT_EQ(works, cross_memory_attach_works());  // cached: the same answer
  EXPECT_EQ(mpi_single_copy_mechanism(), works ? "cma" : "none");
}

#if defined(__linux__) && defined(__x86_64__)
// A process whose seccomp filter refuses process_vm_readv (what a container's profile
// does) gets "no": the probe reads for real rather than assuming.
TEST(SingleCopy, ARefusedReadMeansNone) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_readv, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog prog{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
      _exit(2);  // no seccomp here: nothing to test
    _exit(probe_cross_memory_attach() ? 1 : 0);
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 2) GTEST_SKIP() << "seccomp filters are not available";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the probe said cma although process_vm_readv was refused";
}
#endif

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
