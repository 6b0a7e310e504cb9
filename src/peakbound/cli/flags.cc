#include "peakbound/cli/flags.h"

#include <charconv>
#include <cstdio>

#include "peakbound/core/error.h"
#include "peakbound/core/values.h"

namespace peakbound::cli {

namespace {

std::string flag_name(const std::string& name) {
  // "--seed,-s" -> "--seed"
  return name.substr(0, name.find(','));
}

std::string real_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// Runs a parse, turning our InvalidArgument into CLI11's validation error (one line, exit 2).
template <typename F>
void parsed(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    throw CLI::ValidationError(e.what());
  }
}

}  // namespace

CLI::Option* int_flag(CLI::App* app, const std::string& name, std::int64_t& target, const std::string& help,
                      std::int64_t lo, std::int64_t hi) {
  const std::string flag = flag_name(name);
  auto* o = app->add_option_function<std::string>(
      name, [&target, flag, lo, hi](const std::string& s) { parsed([&] { target = parse_int(s, flag, lo, hi); }); },
      help);
  o->default_str(std::to_string(target))->type_name("INT");
  return o;
}

CLI::Option* int_flag(CLI::App* app, const std::string& name, int& target, const std::string& help, int lo, int hi) {
  const std::string flag = flag_name(name);
  auto* o = app->add_option_function<std::string>(
      name,
      [&target, flag, lo, hi](const std::string& s) {
        parsed([&] { target = static_cast<int>(parse_int(s, flag, lo, hi)); });
      },
      help);
  o->default_str(std::to_string(target))->type_name("INT");
  return o;
}

CLI::Option* optional_int_flag(CLI::App* app, const std::string& name, std::optional<std::int64_t>& target,
                               const std::string& help, std::int64_t lo, std::int64_t hi) {
  const std::string flag = flag_name(name);
  auto* o = app->add_option_function<std::string>(
      name, [&target, flag, lo, hi](const std::string& s) { parsed([&] { target = parse_int(s, flag, lo, hi); }); },
      help);
  o->type_name("INT");
  return o;
}

CLI::Option* real_flag(CLI::App* app, const std::string& name, double& target, const std::string& help, double lo,
                       double hi) {
  const std::string flag = flag_name(name);
  auto* o = app->add_option_function<std::string>(
      name, [&target, flag, lo, hi](const std::string& s) { parsed([&] { target = parse_real(s, flag, lo, hi); }); },
      help);
  o->default_str(real_text(target))->type_name("FLOAT");
  return o;
}

CLI::Option* real_flag(CLI::App* app, const std::string& name, float& target, const std::string& help, double lo,
                       double hi) {
  const std::string flag = flag_name(name);
  auto* o = app->add_option_function<std::string>(
      name,
      [&target, flag, lo, hi](const std::string& s) {
        parsed([&] { target = static_cast<float>(parse_real(s, flag, lo, hi)); });
      },
      help);
  o->default_str(real_text(target))->type_name("FLOAT");
  return o;
}

CLI::Option* seed_flag(CLI::App* app, const std::string& name, std::uint64_t& target, const std::string& help) {
  const std::string flag = flag_name(name);
  auto* o = app->add_option_function<std::string>(
      name,
      [&target, flag](const std::string& s) {
        std::uint64_t v = 0;
        auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || ec != std::errc() || end != s.data() + s.size())
          throw CLI::ValidationError(flag + " must be an integer in [0, 18446744073709551615] (got '" + s + "')");
        target = v;
      },
      help);
  o->default_str(std::to_string(target))->type_name("UINT");
  return o;
}

CLI::Option* device_flag(CLI::App* app, std::string& target) {
  return app
      ->add_option_function<std::string>(
          "--device",
          [&target](const std::string& s) {
            if (s != "cpu" && s != "cuda") throw CLI::ValidationError("--device: '" + s + "' is not a device (use cpu or cuda)");
            target = s;
          },
          "Where the work runs: cpu, or cuda (an NVIDIA GPU; a CUDA build)")
      ->default_str(target);
}

CLI::Option* text_flag(CLI::App* app, const std::string& name, std::string& target, const std::string& help) {
  const std::string flag = flag_name(name);
  auto* o = app->add_option_function<std::string>(
      name,
      [&target, flag](const std::string& s) {
        if (s.find_first_not_of(" \t") == std::string::npos) throw CLI::ValidationError(flag + " must not be empty");
        target = s;
      },
      help);
  o->default_str(target)->type_name("TEXT");
  return o;
}

DType shard_dtype(const std::string& s, const std::string& flag) {
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "f32" || s == "fp32" || s == "float32") return DType::f32;
  throw InvalidArgument(flag + ": '" + s + "' is not a dtype it takes (use bf16 or f32)");
}

}  // namespace peakbound::cli
