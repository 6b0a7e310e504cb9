// `peakbound eval`: the mean cross-entropy (no auxiliary loss) of a model over
// consecutive windows of a token file, llm.c's way: window i reads tokens
// i*S .. i*S+S (inputs the first S, targets the last S), stride S. Under mpirun the
// windows are dealt round-robin over the data-parallel ranks (the --cp groups: the
// ranks of one read the same window, each its zigzag shard), in the same layout flags
// as train. The model is built by the run's setup (train/run.h RunModel). The window's
// length is --seq-len, the name of the sequence length in every command; --context is
// its alias.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "peakbound/cli/command.h"
#include "peakbound/cli/command_paths.h"
#include "peakbound/cli/flags.h"
#include "peakbound/core/error.h"
#include "peakbound/core/launcher.h"
#include "peakbound/core/precision.h"
#include "peakbound/core/units.h"
#include "peakbound/io/token_file.h"
#include "peakbound/ops/gemm.h"
#include "peakbound/schedules/context_layout.h"
#include "peakbound/train/model_spec.h"
#include "peakbound/train/run.h"

namespace peakbound::cli {

namespace {

struct EvalFlags {
  std::string device = "cpu";  // --device
  std::string model = "tiny-moe";
  std::string data;
  std::int64_t seq_len = 256;   // --seq-len, or its alias --context
  std::string seq_name = "--seq-len";  // how the command line spelled it (the errors say the same)
  std::optional<std::int64_t> windows;  // unset: every window of the file
  std::int64_t ep = 0, vocab_group = 0, cp = 1;
  std::uint64_t seed = 1;
  std::string device_memory = "4GiB";
  std::string precision = std::string(precision_name(RunSettings{}.precision));  // --precision, as train's
  bool json = false;
};

// The windows to read; InvalidArgument when the file is short of them.
std::int64_t window_count(const EvalFlags& f, const TokenFile& file) {
  const std::int64_t available = TokenFile::windows(0, file.tokens(), f.seq_len);
  // Not even one window: the file is too short for the context (whatever --windows says).
  if (available < 1)
    throw InvalidArgument("'" + f.data + "' holds " + std::to_string(file.tokens()) +
                          " tokens, too few for one window of " + f.seq_name + " " + std::to_string(f.seq_len) + " (" +
                          std::to_string(f.seq_len) + " + 1 tokens)" +
                          (file.tokens() >= 2 ? "; lower " + f.seq_name + " to at most " + std::to_string(file.tokens() - 1)
                                              : std::string("")));
  const std::int64_t N = f.windows ? *f.windows : available;
  if (N < 1 || N > available)
    throw InvalidArgument("--windows " + std::to_string(N) + ": '" + f.data + "' holds " + std::to_string(available) +
                          " windows of " + std::to_string(f.seq_len) + " + 1 tokens");
  return N;
}

// window_count, and every token read inside the vocabulary: a pass over the windows'
// tokens. Every rank reaches the same verdict, so validate() runs it, once, before any
// collective; run_eval then only needs the count.
void check_windows(const EvalFlags& f, const ModelConfig& c, const TokenFile& file) {
  const std::int64_t N = window_count(f, file);
  for (std::int64_t i = 0; i < std::min(file.tokens(), N * f.seq_len + 1); ++i)
    if (file.at(i) >= static_cast<std::uint32_t>(c.vocab_size))
      throw InvalidArgument("token file '" + f.data + "': token " + std::to_string(file.at(i)) + " at position " +
                            std::to_string(i) + " is outside the model's vocabulary of " +
                            std::to_string(c.vocab_size));
}

int run_eval(const EvalFlags& f) {
  ops::share_host_cores_among_local_ranks();
  std::unique_ptr<Communicator> world_in = world_communicator();
  const int W = world_in->size(), rank = world_in->rank();
  const ModelConfig c = load_model_spec(f.model);
  check_trainable(c);
  const ParallelLayout layout = resolve_layout(f.ep, f.vocab_group, f.cp, c, W);
  const TokenFile file = TokenFile::open(f.data);
  const std::int64_t N = window_count(f, file);  // its tokens were checked by validate()

  // The run's setup (device, groups, model); the forward's math is the same under every schedule.
  ModelSchedules schedules;
  schedules.precision = parse_precision(f.precision, "--precision");
  if (f.device == "cpu") schedules.attention_threads = cpu_attention_threads(W);  // the rank's cores, as train's
  RunModel run(std::move(world_in), f.device, parse_bytes(f.device_memory, "--device-memory"), f.model, c, layout,
               schedules, f.seed);
  Communicator* world = run.world.get();
  MoeTransformer& model = *run.model;

  const std::int64_t DP = W / layout.cp, drank = rank / layout.cp;
  const std::int64_t S = f.seq_len, rounds = (N + DP - 1) / DP;
  std::vector<std::int32_t> in(static_cast<std::size_t>(S)), tg(static_cast<std::size_t>(S));
  double sum = 0;
  std::int64_t count = 0;
  for (std::int64_t r = 0; r < rounds; ++r) {
    const std::int64_t w = r * DP + drank;
    const std::int64_t have = w < N ? 1 : 0;
    if (have) file.window(0, file.tokens(), S, w, in.data(), tg.data());
    const BatchSums s = model.forward(in.data(), tg.data(), have, S);
    sum += s.ce;
    count += s.tokens;
  }
  world->all_reduce(&sum, 1, DType::f64, ReduceOp::sum);
  world->all_reduce(&count, 1, DType::i64, ReduceOp::sum);
  if (rank != 0) return 0;
  const double loss = count > 0 ? sum / static_cast<double>(count) : 0.0;
  if (f.json) {
    std::printf("%s\n", nlohmann::json{{"loss", loss},
                                       {"tokens", count},
                                       {"windows", N},
                                       {"context", S},  // the window's length (--seq-len)
                                       {"model", c.name},
                                       {"precision", precision_name(schedules.precision)},
                                       {"ranks", W},
                                       {"cp", layout.cp}}
                            .dump()
                            .c_str());
  } else {
    std::printf("%s on %s: loss %.6f over %lld tokens (%lld windows of %lld)\n", c.name.c_str(), f.data.c_str(), loss,
                static_cast<long long>(count), static_cast<long long>(N), static_cast<long long>(S));
  }
  return 0;
}

Command add_eval(CLI::App& parent) {
  auto f = std::make_shared<EvalFlags>();
  Command cmd;
  cmd.collective = true;
  CLI::App* app = parent.add_subcommand("eval", "Mean cross-entropy of a model over consecutive windows of a token file");
  cmd.app = app;
  text_flag(app, "--model", f->model, "A preset name or a Hugging Face directory")->capture_default_str();
  text_flag(app, "--data", f->data, "The token file (llm.c / nanoGPT format)")->required();
  int_flag(app, "--seq-len", f->seq_len, "Tokens per window (S)", 1, std::int64_t{1} << 24);
  int_flag(app, "--context", f->seq_len, "Alias of --seq-len", 1, std::int64_t{1} << 24);
  optional_int_flag(app, "--windows", f->windows, "Windows to read from the start (default: all)", 1,
                    std::int64_t{1} << 40);
  int_flag(app, "--ep", f->ep, "Expert-parallel size (0 = the largest that divides ranks and experts)", 0, 1 << 24);
  int_flag(app, "--vocab-group", f->vocab_group, "Ranks sharing the LM head by vocabulary (0 = all)", 0, 1 << 24);
  int_flag(app, "--cp", f->cp, "Context-parallel size: consecutive ranks splitting every window (ring attention)", 1,
           1 << 24);
  seed_flag(app, "--seed", f->seed, "Initialisation seed of a preset model");
  device_flag(app, f->device);
  text_flag(app, "--device-memory", f->device_memory, "Device budget per rank")->capture_default_str();
  text_flag(app, "--precision", f->precision,
            "bf16 (the forward in bf16 with fp32 statistics and loss sums, as train's) or f32")
      ->capture_default_str();
  app->add_flag("--json", f->json, "Print {\"loss\", \"tokens\", ...} as JSON");
  cmd.validate = [f, app] {
    (void)parse_precision(f->precision, "--precision");
    if (app->count("--context") > 0 && app->count("--seq-len") > 0)
      throw InvalidArgument("--context is an alias of --seq-len: give one");
    if (app->count("--context") > 0) f->seq_name = "--context";
    CommandPaths paths;
    paths.inputs = {{"--data", f->data}};
    paths.model = f->model;
    check_command_paths(nullptr, paths);  // a FIFO, a folder
    const ModelConfig c = load_model_spec(f->model);
    check_trainable(c);
    (void)resolve_layout(f->ep, f->vocab_group, f->cp, c, launcher_size());
    check_context_split(f->cp, f->seq_len, f->seq_name);
    check_windows(*f, c, TokenFile::open(f->data));
    (void)parse_bytes(f->device_memory, "--device-memory");
  };
  cmd.run = [f] { return run_eval(*f); };
  return cmd;
}

const bool registered = register_command("", "eval", add_eval);

}  // namespace

}  // namespace peakbound::cli
