// Fuzz target: the Hugging Face config.json importer (model/hf_config.h), from the file
// through the JSON parser, the field readers and ModelConfig::validate, then the first
// consumer of what it returns: the parameter counter. On success the config validates
// again and its parameter count adds up.
#include <cstdint>

#include "peakbound/model/hf_config.h"
#include "peakbound/model/param_count.h"
#include "fuzz_check.h"

using namespace peakbound;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fuzz::MemFile mem(data, size);
  fuzz::expect_ours([&] {
    const ModelConfig c = load_hf_config(mem.path());
    c.validate();
    FUZZ_CHECK(c.num_moe_layers() <= c.num_layers);
    const ParamCount p = count_params(c);
    FUZZ_CHECK(p.total >= 0 && p.active >= 0 && p.active <= p.total);
  });
  return 0;
}
