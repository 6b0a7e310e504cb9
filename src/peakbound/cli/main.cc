// peakbound: the command-line entry point. Parses flags with CLI11, runs the chosen
// subcommand, and turns every error into one line on stderr and a non-zero exit.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <thread>

#include "peakbound/build_info.h"
#include "peakbound/cli/command.h"
#include "peakbound/comm/communicator.h"
#include "peakbound/core/error.h"
#include "peakbound/ops/gemm.h"
#ifdef PEAKBOUND_HAVE_MPI
#include <mpi.h>
#endif

namespace {

// Under mpirun one rank's error would leave the others waiting in a collective:
// abort the whole job after printing.
void abort_peers_if_mpi(int code) {
#ifdef PEAKBOUND_HAVE_MPI
  int init = 0, fin = 0, size = 1;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) {
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, code);
  }
#else
  (void)code;
#endif
}

void print_error(const std::string& message) {
  // What was printed before the failure (the banner, the plan) comes before the error
  // line also when stdout is a file (fully buffered) and stderr is not.
  std::fflush(stdout);
  std::fprintf(stderr, "peakbound: error: %s\n", message.c_str());
  std::fflush(stderr);
}

// A failure only this rank may have seen: print it, naming the rank when there are
// several (every rank's device is cpu:0 or cuda:0 of its own process), and end the job.
int fail(int code, const std::string& message) {
  const int size = peakbound::launcher_size();
  print_error(size > 1 ? "rank " + std::to_string(peakbound::launcher_rank()) + " of " + std::to_string(size) +
                             ": " + message
                       : message);
  abort_peers_if_mpi(code);
  return code;
}

// A failure every rank reaches alike (bad flags, a failed check before any
// communication, an AgreedError): printed once, by rank 0; every rank exits with the
// code, nothing aborts. Under a launcher the ranks wait for rank 0 to have written its
// line: mpirun ends the job when the first rank exits non-zero, and a rank that got there
// before rank 0 had printed would leave the user with no reason at all.
// `all_ranks` false: only rank 0 runs (a one-process command), so nobody is waited for.
int fail_everywhere(int code, const std::string& message, bool all_ranks = true) {
  const bool lead = peakbound::launcher_rank() == 0;
  if (lead) {
    // Testing hook: delays rank 0's line, the order that lost it under load.
    if (const char* ms = std::getenv("PEAKBOUND_TEST_DELAY_LEAD_ERROR_MS"))
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(ms)));
    print_error(message);
  }
  if (all_ranks && peakbound::launcher_size() > 1) {
    try {
      peakbound::world_communicator()->barrier();
    } catch (const std::exception&) {
      // No MPI to wait with (a build without it): exit as before.
    }
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace peakbound;
  // Before anything else (MPI included): OpenBLAS's kernels for a CPU newer than it knows.
  ops::prefer_blas_kernels(argv);
  CLI::App app("peakbound: trains Mixture-of-Experts models at long context with bounded memory peaks",
               "peakbound");
  app.require_subcommand(0, 1);
  app.set_version_flag("--version", cli::build_description());
  std::vector<cli::Command> commands = cli::build_commands(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    // An option given more often than it takes (CLI11: "At Most 1 required but received
    // 2"): name it and the values given, "--steps given twice (10 and 20); give it once".
    if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr) {
      std::function<std::string(const CLI::App&)> repeated = [&](const CLI::App& a) -> std::string {
        for (const CLI::Option* o : a.get_options()) {
          const std::vector<std::string>& given = o->results();
          if (o->get_multi_option_policy() != CLI::MultiOptionPolicy::Throw || o->get_items_expected_max() != 1 ||
              given.size() < 2)
            continue;
          std::string values;
          for (std::size_t i = 0; i < given.size(); ++i)
            values += (i == 0 ? "" : i + 1 == given.size() ? " and " : ", ") + (given[i].empty() ? "''" : given[i]);
          return o->get_name() + " given " + (given.size() == 2 ? "twice" : std::to_string(given.size()) + " times") +
                 " (" + values + "); give it once";
        }
        for (const CLI::App* sub : a.get_subcommands())
          if (std::string m = repeated(*sub); !m.empty()) return m;
        return "";
      };
      if (std::string m = repeated(app); !m.empty()) return fail_everywhere(2, m);
    }
    // A group (bench, verify) without a known case: name what was given and the choices.
    for (CLI::App* group : app.get_subcommands()) {
      auto cases = group->get_subcommands({});
      if (cases.empty() || !group->get_subcommands().empty()) continue;
      std::string names, given;
      for (CLI::App* c : cases) names += (names.empty() ? "" : ", ") + c->get_name();
      for (const std::string& r : group->remaining()) given += (given.empty() ? "" : " ") + r;
      msg = "'" + group->get_name() + "' needs one of: " + names + (given.empty() ? "" : " (got '" + given + "')");
    }
    return fail_everywhere(2, msg + " (run 'peakbound --help' for usage)");
  }

  try {
    // A case of a group (bench vocab) is parsed together with its group: run the deepest.
    for (auto it = commands.rbegin(); it != commands.rend(); ++it) {
      if (!it->app->parsed() || !it->app->get_subcommands().empty()) continue;
      if (!it->collective && launcher_rank() != 0) return 0;  // one report, from rank 0
      if (it->validate) {
        try {
          it->validate();
        } catch (const Error& e) {
          return fail_everywhere(1, e.what(), it->collective);
        }
      }
      return it->run();
    }
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const AgreedError& e) {
    return fail_everywhere(1, e.what());
  } catch (const Error& e) {
    return fail(1, e.what());
  } catch (const std::bad_alloc&) {
    return fail(1, "out of host memory");
  } catch (const std::exception& e) {
    return fail(3, std::string("unexpected failure: ") + e.what());
  }
}
