// peakbound: the command-line entry point. Parses flags with CLI11, runs the chosen
// subcommand, and turns every error into one line on stderr and a non-zero exit.
#include <cstdio>
#include <exception>
#include <string>

#include "peakbound/build_info.h"
#include "peakbound/cli/command.h"
#include "peakbound/comm/communicator.h"
#include "peakbound/core/error.h"
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
  std::fprintf(stderr, "peakbound: error: %s\n", message.c_str());
  std::fflush(stderr);
}

// A failure only this rank may have seen: print it and end the whole job.
int fail(int code, const std::string& message) {
  print_error(message);
  abort_peers_if_mpi(code);
  return code;
}

// A failure every rank reaches alike (bad flags, a failed check before any
// communication): printed once, by rank 0; every rank exits with the code, nothing aborts.
int fail_everywhere(int code, const std::string& message) {
  if (peakbound::launcher_rank() == 0) print_error(message);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace peakbound;
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
          return fail_everywhere(1, e.what());
        }
      }
      return it->run();
    }
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const Error& e) {
    return fail(1, e.what());
  } catch (const std::bad_alloc&) {
    return fail(1, "out of host memory");
  } catch (const std::exception& e) {
    return fail(3, std::string("unexpected failure: ") + e.what());
  }
}
