#include "engine/plugin_loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace wm {
namespace {

std::string executable_dir() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  return exe.parent_path().string();
}

// every function of the table must be there: a null one would crash later, far from its cause
absl::Status check_table(const WmPluginApi& a, const std::string& path) {
  const void* const fns[] = {
      reinterpret_cast<const void*>(a.probe),          reinterpret_cast<const void*>(a.create),
      reinterpret_cast<const void*>(a.destroy),        reinterpret_cast<const void*>(a.last_error),
      reinterpret_cast<const void*>(a.device_info),    reinterpret_cast<const void*>(a.memory_stats),
      reinterpret_cast<const void*>(a.supports),       reinterpret_cast<const void*>(a.set_tuning),
      reinterpret_cast<const void*>(a.counter),
      reinterpret_cast<const void*>(a.alloc),          reinterpret_cast<const void*>(a.free),
      reinterpret_cast<const void*>(a.upload),         reinterpret_cast<const void*>(a.download),
      reinterpret_cast<const void*>(a.synchronize),    reinterpret_cast<const void*>(a.timer_start),
      reinterpret_cast<const void*>(a.timer_stop),     reinterpret_cast<const void*>(a.upload_weight),
      reinterpret_cast<const void*>(a.linear),         reinterpret_cast<const void*>(a.layer_norm_modulate),
      reinterpret_cast<const void*>(a.rms_norm_rope),  reinterpret_cast<const void*>(a.gelu),
      reinterpret_cast<const void*>(a.gated_residual), reinterpret_cast<const void*>(a.patchify),
      reinterpret_cast<const void*>(a.unpatchify),     reinterpret_cast<const void*>(a.euler_step),
      reinterpret_cast<const void*>(a.kv_reservation_bytes), reinterpret_cast<const void*>(a.kv_create),
      reinterpret_cast<const void*>(a.kv_destroy),     reinterpret_cast<const void*>(a.kv_append),
      reinterpret_cast<const void*>(a.kv_bytes),       reinterpret_cast<const void*>(a.kv_frames),
      reinterpret_cast<const void*>(a.kv_reconstruct), reinterpret_cast<const void*>(a.attention),
      reinterpret_cast<const void*>(a.ffn),            reinterpret_cast<const void*>(a.kv_append_batch),
      reinterpret_cast<const void*>(a.gated_residual_norm), reinterpret_cast<const void*>(a.rms_norm_rope_qk),
      reinterpret_cast<const void*>(a.prepare_attention), reinterpret_cast<const void*>(a.graph_begin),
      reinterpret_cast<const void*>(a.graph_end),      reinterpret_cast<const void*>(a.graph_launch),
      reinterpret_cast<const void*>(a.noise_frames),   reinterpret_cast<const void*>(a.add_rows),
      reinterpret_cast<const void*>(a.kv_probe),
  };
  for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); ++i)
    if (fns[i] == nullptr)
      return absl::FailedPreconditionError(absl::StrCat(path, ": plugin API table entry ", i, " is null"));
  if (a.name == nullptr) return absl::FailedPreconditionError(absl::StrCat(path, ": plugin has no name"));
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> plugin_candidates(const std::string& explicit_path, const std::string& file_name) {
  if (!explicit_path.empty()) return {explicit_path};
  std::vector<std::string> out;
  const std::string dir = executable_dir();
  if (!dir.empty()) out.push_back(dir + "/" + file_name);
  out.push_back(file_name);  // a bare name: dlopen searches LD_LIBRARY_PATH and the cache
  return out;
}

absl::StatusOr<std::shared_ptr<const LoadedPlugin>> load_plugin(const std::string& path) {
  // RTLD_LOCAL keeps the plugin's CUDA symbols out of the process's namespace;
  // RTLD_NODELETE keeps it mapped for good
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::NotFoundError(absl::StrCat("cannot load plugin ", path, ": ", why != nullptr ? why : "unknown error"));
  }
  dlerror();
  auto entry = reinterpret_cast<WmPluginEntryFn>(dlsym(handle, WM_PLUGIN_ENTRY_SYMBOL));
  if (entry == nullptr) {
    dlclose(handle);
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a wmserve plugin: it exports no '", WM_PLUGIN_ENTRY_SYMBOL, "'"));
  }
  const WmPluginApi* api = entry();
  if (api == nullptr) {
    dlclose(handle);
    return absl::FailedPreconditionError(absl::StrCat(path, ": ", WM_PLUGIN_ENTRY_SYMBOL, "() returned no API"));
  }
  if (api->abi_version != WM_PLUGIN_ABI_VERSION) {
    const uint32_t theirs = api->abi_version;
    dlclose(handle);
    return absl::FailedPreconditionError(absl::StrCat(path, " speaks plugin ABI version ", theirs,
                                                      ", this wmserve speaks version ", WM_PLUGIN_ABI_VERSION,
                                                      ": rebuild the plugin from the same source tree"));
  }
  if (api->struct_size != sizeof(WmPluginApi)) {
    const uint32_t theirs = api->struct_size;
    dlclose(handle);
    return absl::FailedPreconditionError(absl::StrCat(path, ": plugin API table is ", theirs,
                                                      " bytes, this wmserve expects ", sizeof(WmPluginApi),
                                                      " (same ABI version, different header: rebuild the plugin)"));
  }
  if (absl::Status s = check_table(*api, path); !s.ok()) {
    dlclose(handle);
    return s;
  }
  // the handle is not kept: RTLD_NODELETE pins the library
  return std::make_shared<const LoadedPlugin>(path, api);
}

absl::StatusOr<std::shared_ptr<const LoadedPlugin>> find_plugin(const std::string& explicit_path,
                                                                const std::string& file_name) {
  std::vector<std::string> tried;
  for (const std::string& path : plugin_candidates(explicit_path, file_name)) {
    auto p = load_plugin(path);
    if (p.ok()) return p;
    // a library that loads but is wrong is an error to report, not to skip
    if (p.status().code() != absl::StatusCode::kNotFound) return p.status();
    tried.push_back(std::string(p.status().message()));
  }
  return absl::NotFoundError(absl::StrCat("no ", file_name, " found; tried: ", absl::StrJoin(tried, "; ")));
}

}  // namespace wm
