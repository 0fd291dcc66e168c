// wmckpt: model checkpoint utility.
//   wmckpt init --config F --seed N --out DIR [--force]
//                                               seeded random checkpoint for any config
//                                               (--force: replace the model DIR holds, both
//                                               files or neither; others, prompts/ say, stay)
//   wmckpt check --model DIR                    load and validate a checkpoint, print its summary
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/image_io.h"
#include "engine/model_config.h"
#include "engine/safetensors.h"
#include "engine/weights.h"

ABSL_FLAG(std::string, config, "", "model config.json (init)");
ABSL_FLAG(uint64_t, seed, 0, "random seed (init)");
ABSL_FLAG(std::string, out, "", "output model directory (init)");
ABSL_FLAG(bool, force, false,
          "init: replace the model (config.json, model.safetensors) the output directory holds; other files such "
          "as prompts/ stay");
ABSL_FLAG(std::string, model, "", "model directory (check)");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("wmckpt init --config F --seed N --out DIR [--force] | wmckpt check --model DIR");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::fprintf(stderr, "usage: %s\n", absl::ProgramUsageMessage().data());
    return 2;
  }
  const std::string cmd = args[1];
  if (cmd == "init") {
    if (absl::GetFlag(FLAGS_config).empty() || absl::GetFlag(FLAGS_out).empty()) {
      std::fprintf(stderr, "wmckpt init: --config and --out are required\n");
      return 2;
    }
    // random weights over a model's own (a trained one, say) only when asked;
    // a config.json alone (an init that failed writing the weights) is no model
    const std::string out = absl::GetFlag(FLAGS_out);
    std::error_code ec;
    const auto weights = std::filesystem::symlink_status(out + "/model.safetensors", ec);
    if (!absl::GetFlag(FLAGS_force) && !ec && std::filesystem::exists(weights)) {
      std::fprintf(stderr, "wmckpt: %s already holds a model (model.safetensors); pass --force to replace it\n",
                   out.c_str());
      return 1;
    }
    auto config = wm::load_model_config(absl::GetFlag(FLAGS_config));
    if (!config.ok()) {
      std::fprintf(stderr, "wmckpt: %s\n", config.status().ToString().c_str());
      return 1;
    }
    if (auto st = wm::check_weights_fit_memory(*config); !st.ok()) {
      std::fprintf(stderr, "wmckpt: %s\n", st.ToString().c_str());
      return 1;
    }
    const wm::HostWeights w = wm::random_host_weights(*config, absl::GetFlag(FLAGS_seed));
    if (auto st = wm::save_checkpoint(*config, w, out); !st.ok()) {
      std::fprintf(stderr, "wmckpt: %s\n", st.ToString().c_str());
      return 1;
    }
    std::printf("wrote %s: %s, %lld parameters\n", absl::GetFlag(FLAGS_out).c_str(), config->name.c_str(),
                static_cast<long long>(config->parameter_count()));
    if (auto st = wm::flush_stdout(); !st.ok()) {
      std::fprintf(stderr, "wmckpt: %s\n", st.ToString().c_str());
      return 1;
    }
    return 0;
  }
  if (cmd == "check") {
    const std::string dir = absl::GetFlag(FLAGS_model);
    if (dir.empty()) {
      std::fprintf(stderr, "wmckpt: check needs --model DIR\n");
      return 2;
    }
    auto config = wm::load_model_config(dir + "/config.json");
    if (!config.ok()) {
      std::fprintf(stderr, "wmckpt: %s\n", config.status().ToString().c_str());
      return 1;
    }
    auto file = wm::SafetensorsFile::open(dir + "/model.safetensors");
    if (!file.ok()) {
      std::fprintf(stderr, "wmckpt: %s\n", file.status().ToString().c_str());
      return 1;
    }
    auto w = wm::load_host_weights(*config, **file);
    if (!w.ok()) {
      std::fprintf(stderr, "wmckpt: %s\n", w.status().ToString().c_str());
      return 1;
    }
    std::printf("%s: ok, %s, %lld parameters, %dx%d, %d tokens/frame\n", dir.c_str(), config->name.c_str(),
                static_cast<long long>(config->parameter_count()), config->width, config->height,
                config->tokens_per_frame());
    return 0;
  }
  std::fprintf(stderr, "wmckpt: unknown command '%s'\n", cmd.c_str());
  return 2;
}
