// wmserve: the inference server. `wmserve --help` lists the flags;
// docs/API.md describes the API, docs/ARCHITECTURE.md how it runs.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/cli.h"
#include "common/image_io.h"
#include "common/tls_files.h"
#include "engine/backend.h"
#include "engine/blas.h"
#include "quant/kv_options.h"
#include "server/auth.h"
#include "server/grpc_log.h"
#include "server/server.h"

#ifndef WM_VERSION
#define WM_VERSION "dev"
#endif

ABSL_FLAG(std::string, model, "",
          "model directory (config.json + model.safetensors); default: models/default if it exists");
ABSL_FLAG(std::string, host, "0.0.0.0", "address the gRPC server listens on");
ABSL_FLAG(int, port, 50051, "gRPC port (0: any free port, printed and written to --port_file)");
ABSL_FLAG(std::string, metrics_host, "", "address of the Prometheus /metrics endpoint (default: --host)");
ABSL_FLAG(int, metrics_port, 9464, "Prometheus /metrics port (0: any free port; -1: off)");
ABSL_FLAG(std::string, metrics_auth, "",
          "file of 'NAME TOKEN' lines: /metrics answers only HTTP basic auth with one of them (read again on "
          "SIGHUP; the endpoint is plain HTTP: keep it on a private network)");
ABSL_FLAG(std::string, port_file, "", "write {\"port\": P, \"metrics_port\": M} here once listening");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain: serve gRPC over TLS with it (and --tls_key); the metrics port stays plain HTTP");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert (not encrypted)");
ABSL_FLAG(int, tls_reload_s, 60,
          "read the TLS files again this often and serve a renewed certificate without a restart (0: never)");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA certificates: with TLS, every client must present a certificate one of them signed (mutual TLS)");
ABSL_FLAG(std::string, auth_tokens, "",
          "file of API tokens, lines 'NAME TOKEN': every call but the health checks must send 'authorization: "
          "Bearer TOKEN', and the per-client caps count per NAME (read again on SIGHUP, which ends the "
          "sessions of tokens no longer in it)");
ABSL_FLAG(std::string, session_log, "-",
          "one JSON line per session start, park, resume and end: - (standard output), a file to append to "
          "(opened again on SIGHUP), or off");
ABSL_FLAG(std::string, device, "cpu",
          "engine device: cpu, cuda (the CUDA plugin and a GPU, or an error) or auto (cuda if possible)");
ABSL_FLAG(bool, device_graphs, true,
          "on the GPU: record each step's first denoising pass as a CUDA graph and run the others from it "
          "(--device_graphs=false issues every op of every pass)");
ABSL_FLAG(bool, batch_invariant, false,
          "every session's frames are exactly those it gets alone (on the CPU: and from wmgen) whatever shares its "
          "batch: the dense layers (on a GPU: and attention) run per session, some 10-15% of a CPU's batched "
          "throughput");
ABSL_FLAG(std::string, cuda_plugin, "", "path of libwm_cuda.so (default: beside wmserve, then the loader's path)");
ABSL_FLAG(int, threads, 0, "engine CPU threads (0: the libraries' default, all cores)");
ABSL_FLAG(int64_t, kv_budget_bytes, int64_t{2} << 30,
          "KV-cache byte budget: admission reserves each session's worst-case cache from it");
ABSL_FLAG(std::string, cache_format, "fp16", "default KV-cache format when Start names none");
ABSL_FLAG(std::string, kv_options, "",
          "cache format options, e.g. block=32,psac_bits=4 (docs/QUANT.md: span_frames, centroids, "
          "tokens_per_centroid, block, kmeans_iters, quantize_sinks, psac_bits, psac_refresh_frames, kivi_group, "
          "kivi_residual); \"\": the defaults");
ABSL_FLAG(int, max_sessions, 64, "sessions at most (0: only the KV budget limits)");
ABSL_FLAG(int, max_sessions_per_client, 16, "sessions at most per client address (0: no cap)");
ABSL_FLAG(double, idle_ttl_s, 60, "close a session after this many seconds without an action (0: never)");
ABSL_FLAG(double, park_ttl_s, 30,
          "keep a session whose stream broke (cancelled, network drop) this many seconds for a resume with its "
          "token, still holding its KV reservation (0: close it at once)");
ABSL_FLAG(int, max_batch, 16, "sessions per engine step at most (their buffers are allocated at start-up)");
ABSL_FLAG(double, max_batch_wait_ms, 2, "how long a ready session waits for others to fill a batch");
ABSL_FLAG(int, action_queue, 32, "per-action pacing: queued actions per session at most");
ABSL_FLAG(int, jpeg_quality, 90, "JPEG quality when Start asks for none (1..100)");
ABSL_FLAG(double, max_fps, 240, "highest fixed-rate fps a session may ask for");
ABSL_FLAG(int, max_prompt_frames, 16,
          "prompt frames a Start may carry at most (each costs one engine pass on the engine thread)");
ABSL_FLAG(double, client_prompt_rate, 4,
          "Starts and prompt frames a second per client (0: no limit): a Start costs its prompt frames, at least "
          "one; a client may spend --client_prompt_burst at once, then this many a second; a Start past that is "
          "refused (RESOURCE_EXHAUSTED, with when to retry)");
ABSL_FLAG(int, client_prompt_burst, 32,
          "what a client may spend at once on Starts and prompt frames (at least --max_prompt_frames)");
ABSL_FLAG(double, audit_fraction, 0.0,
          "fraction of sessions (0..1) that keep a full-precision shadow of their cache and feed "
          "wm_token_selection_drift_ratio{format}; each reserves a shadow cache of the KV budget "
          "and costs probes (the shadow: fp32 on the CPU, fp16 pages on a GPU)");
ABSL_FLAG(double, audit_blocks, 0.125,
          "fraction (0..1) of an audited session's blocks made a second time with its full-precision shadow as "
          "the history, for wm_shadow_frame_psnr_db{format}: such a block costs its denoising passes twice");
ABSL_FLAG(int, encoder_threads, 2, "JPEG encoder threads");
ABSL_FLAG(int, max_connections, 4096,
          "gRPC connections open at once at most; more are closed at accept (0: only the open-file limit, less a "
          "reserve, caps them)");
ABSL_FLAG(int, max_connections_per_client, 64,
          "gRPC connections open at once from one client address (an IPv6 one by its /64) at most (0: no cap)");
ABSL_FLAG(double, client_connection_rate, 16,
          "new gRPC connections a client address may open a second, after --client_connection_burst at once "
          "(0: no limit)");
ABSL_FLAG(int, client_connection_burst, 64, "new gRPC connections a client address may open at once");
ABSL_FLAG(int, max_calls_per_connection, 200,
          "calls (Play streams, unary calls, health checks) a connection may open in one second; past that it is "
          "shut down and its address refused for 10 s (HTTP/2 rapid reset; 0: no limit)");
ABSL_FLAG(int, max_concurrent_streams, 128, "concurrent streams per client connection (0: gRPC's default)");
ABSL_FLAG(int64_t, max_request_bytes, 4 << 20, "largest request message accepted (RESOURCE_EXHAUSTED above)");
ABSL_FLAG(double, start_timeout_s, 10,
          "end a Play stream that sends no Start within this (DEADLINE_EXCEEDED; 0: wait forever)");
ABSL_FLAG(int, keepalive_time_s, 30, "ping idle connections this often");
ABSL_FLAG(int, handshake_timeout_s, 10,
          "close a connection that has not finished its TLS or HTTP/2 handshake within this (1..300)");
ABSL_FLAG(int, keepalive_timeout_s, 10, "drop a connection whose ping is not answered within this");
ABSL_FLAG(int, min_client_ping_interval_s, 10, "clients may send keepalive pings at most this often");
ABSL_FLAG(double, shutdown_grace_s, 10, "on SIGTERM/SIGINT: how long open sessions may go on before they are ended");

namespace {

constexpr int kGrpcLogLinesPerSecond = 20;

int fail(const std::string& msg) {
  std::fprintf(stderr, "wmserve: %s\n", msg.c_str());
  return 1;
}

std::string default_model_dir() {
  for (const char* dir : {"models/default"}) {
    std::error_code ec;
    if (std::filesystem::exists(std::filesystem::path(dir) / "config.json", ec)) return dir;
  }
  return "";
}

// every connection is a file descriptor: take the hard limit, not the soft
// one (often 1024); returns the limit in force (0: unknown)
int64_t raise_open_file_limit() {
  rlimit r;
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return 0;
  const rlim_t want = r.rlim_max == RLIM_INFINITY ? rlim_t{1} << 20 : r.rlim_max;
  if (r.rlim_cur < want) {
    r.rlim_cur = want;
    setrlimit(RLIMIT_NOFILE, &r);
    getrlimit(RLIMIT_NOFILE, &r);
  }
  return r.rlim_cur == RLIM_INFINITY ? int64_t{1} << 20 : static_cast<int64_t>(r.rlim_cur);
}

// descriptors kept for everything but connections: the model's files, the
// engine's and gRPC's own, the metrics endpoint's, the session log
constexpr int64_t kReservedFds = 256;

// a file of NAME TOKEN lines (--auth_tokens, --metrics_auth), checked; a
// warning on stderr when others may read it
absl::StatusOr<std::shared_ptr<const wm::server::TokenTable>> load_tokens(const std::string& flag,
                                                                          const std::string& path) {
  auto text = wm::read_file(path, 1 << 20);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", text.status().message()));
  auto tokens = wm::server::TokenTable::parse(*text, absl::StrCat("--", flag, " ", path));
  if (!tokens.ok()) return tokens.status();
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0)
    std::fprintf(stderr, "wmserve: warning: --%s %s can be read by others (chmod 600 it)\n", flag.c_str(),
                 path.c_str());
  return std::make_shared<const wm::server::TokenTable>(std::move(*tokens));
}

// SIGHUP: the session log's file opened again (after a rotation: what the
// reload ends is logged there) and the API tokens read again (a bad file
// keeps the ones in use; the sessions of a token no longer there end)
void reload(wm::server::Server& server, const std::string& tokens_path, const std::string& metrics_auth_path) {
  if (auto st = server.reopen_session_log(); !st.ok())
    std::printf("wmserve: SIGHUP: %s\n", std::string(st.message()).c_str());
  if (!tokens_path.empty()) {
    auto tokens = load_tokens("auth_tokens", tokens_path);
    if (tokens.ok()) {
      const size_t n = (*tokens)->size();
      const int revoked = server.set_tokens(*std::move(tokens));
      std::printf("wmserve: SIGHUP: %zu API token(s) from %s; %d session(s) of revoked tokens closed\n", n,
                  tokens_path.c_str(), revoked);
    } else {
      std::printf("wmserve: SIGHUP: %s; the tokens in use stay\n", std::string(tokens.status().message()).c_str());
    }
  }
  if (!metrics_auth_path.empty()) {
    auto table = load_tokens("metrics_auth", metrics_auth_path);
    if (table.ok()) {
      std::printf("wmserve: SIGHUP: %zu metrics credential(s) from %s\n", (*table)->size(), metrics_auth_path.c_str());
      server.set_metrics_auth(*std::move(table));
    } else {
      std::printf("wmserve: SIGHUP: %s; the metrics credentials in use stay\n",
                  std::string(table.status().message()).c_str());
    }
  }
  std::fflush(stdout);
}

// waits up to `ms` for SIGINT/SIGTERM/SIGHUP (blocked in every thread); returns the signal or 0
int wait_signal(const sigset_t& set, int ms) {
  timespec ts{ms / 1000, static_cast<long>(ms % 1000) * 1000000L};
  const int sig = sigtimedwait(&set, nullptr, &ts);
  return sig > 0 ? sig : 0;
}

// The OpenMP runtime reads OMP_WAIT_POLICY when it loads, before main. Its
// default lets the CPU engine's idle workers spin for milliseconds, which
// starves the gRPC, JPEG and OpenBLAS threads on a busy machine (10-50x
// slower steps, docs/PERFORMANCE.md). Not spinning at all costs the other
// way: a step's loops come microseconds apart, and a worker woken from
// sleep for each one made the default model's steps 1.3x slower. So when
// the environment does not choose, wmserve runs itself again with the
// passive policy and a brief spin (GNU OpenMP's GOMP_SPINCOUNT, about
// 0.1 ms; other runtimes ignore it), which keeps the workers between the
// loops of a step and lets them sleep between steps. An explicit choice is
// kept. Returns only if that failed (the server then runs with the default).
constexpr char kSpinCount[] = "10000";
void reexec_with_passive_openmp(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  if (setenv("GOMP_SPINCOUNT", kSpinCount, /*overwrite=*/0) != 0) return;
  execv("/proc/self/exe", argv);
  std::fprintf(stderr, "wmserve: could not restart with OMP_WAIT_POLICY=passive (%s); OpenMP's default applies\n",
               std::strerror(errno));
}

}  // namespace

int main(int argc, char** argv) {
  reexec_with_passive_openmp(argv);
  absl::SetProgramUsageMessage(
      "the wmserve inference server: serves one world model over gRPC (wmserve.v1.WorldModel).\n"
      "  wmserve [--model DIR] [--port 50051] [--metrics_port 9464] [--kv_budget_bytes N] ...\n"
      "Without --model it serves models/default. SIGTERM/SIGINT drain and exit 0; SIGHUP reloads\n"
      "--auth_tokens and --metrics_auth and reopens --session_log. See docs/API.md.");
  if (auto bad = wm::parse_flags_only(argc, argv)) {
    std::fprintf(stderr, "wmserve: %s\n", bad->c_str());
    return 1;
  }

  // signals are taken synchronously by main: block them before any thread starts
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  const int64_t fd_limit = raise_open_file_limit();

  std::string model = absl::GetFlag(FLAGS_model);
  if (model.empty()) model = default_model_dir();
  if (model.empty())
    return fail(
        "no --model given and models/default does not exist. Make a model first, e.g. a random one:\n"
        "  build/tools/wmckpt init --config configs/default.json --seed 1 --out models/default\n"
        "or pass --model DIR (a directory with config.json and model.safetensors).");

  wm::server::ServerOptions o;
  o.host = absl::GetFlag(FLAGS_host);
  o.port = absl::GetFlag(FLAGS_port);
  o.metrics_host = absl::GetFlag(FLAGS_metrics_host).empty() ? o.host : absl::GetFlag(FLAGS_metrics_host);
  o.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  o.encoder_threads = absl::GetFlag(FLAGS_encoder_threads);
  o.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  o.keepalive.time_s = absl::GetFlag(FLAGS_keepalive_time_s);
  o.handshake_timeout_s = absl::GetFlag(FLAGS_handshake_timeout_s);
  o.keepalive.timeout_s = absl::GetFlag(FLAGS_keepalive_timeout_s);
  o.keepalive.min_client_ping_interval_s = absl::GetFlag(FLAGS_min_client_ping_interval_s);
  o.session_log = absl::GetFlag(FLAGS_session_log) == "off" ? "" : absl::GetFlag(FLAGS_session_log);
  if (absl::GetFlag(FLAGS_session_log).empty()) return fail("--session_log: give -, a file, or off");
  o.worker.engine.model_dir = model;
  o.worker.engine.device = absl::GetFlag(FLAGS_device);
  o.worker.engine.device_graphs = absl::GetFlag(FLAGS_device_graphs);
  o.worker.engine.batch_invariant = absl::GetFlag(FLAGS_batch_invariant);
  o.worker.engine.audit_block_fraction = absl::GetFlag(FLAGS_audit_blocks);
  o.worker.engine.cuda_plugin = absl::GetFlag(FLAGS_cuda_plugin);
  o.worker.engine.threads = absl::GetFlag(FLAGS_threads);
  o.worker.engine.kv_budget_bytes = absl::GetFlag(FLAGS_kv_budget_bytes);
  if (auto kv = wm::parse_kv_format_options(absl::GetFlag(FLAGS_kv_options)); kv.ok()) {
    o.worker.engine.kv_options = *kv;
  } else {
    return fail(absl::StrCat("--kv_options: ", kv.status().message()));
  }
  o.worker.default_cache_format = absl::GetFlag(FLAGS_cache_format);
  o.service.audit_fraction = absl::GetFlag(FLAGS_audit_fraction);
  o.worker.max_batch = absl::GetFlag(FLAGS_max_batch);
  o.worker.action_queue = absl::GetFlag(FLAGS_action_queue);
  o.sessions.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  o.sessions.max_sessions_per_client = absl::GetFlag(FLAGS_max_sessions_per_client);
  o.sessions.client_prompt_rate = absl::GetFlag(FLAGS_client_prompt_rate);
  o.sessions.client_prompt_burst = absl::GetFlag(FLAGS_client_prompt_burst);
  o.service.version = WM_VERSION;
  o.service.limits.default_jpeg_quality = absl::GetFlag(FLAGS_jpeg_quality);
  o.service.limits.max_fps = absl::GetFlag(FLAGS_max_fps);
  o.service.limits.max_prompt_frames = absl::GetFlag(FLAGS_max_prompt_frames);
  o.service.max_request_bytes = absl::GetFlag(FLAGS_max_request_bytes);

  // flags a user can get wrong, checked before anything starts
  if (o.port < 0 || o.port > 65535) return fail("--port must be 0..65535");
  if (o.metrics_port < -1 || o.metrics_port > 65535) return fail("--metrics_port must be -1..65535");
  if (o.worker.engine.kv_budget_bytes <= 0) return fail("--kv_budget_bytes must be positive");
  if (o.worker.max_batch < 1) return fail("--max_batch must be at least 1");
  if (!(absl::GetFlag(FLAGS_max_batch_wait_ms) >= 0 && absl::GetFlag(FLAGS_max_batch_wait_ms) <= 1000))
    return fail("--max_batch_wait_ms must be 0..1000");
  if (!(absl::GetFlag(FLAGS_audit_fraction) >= 0 && absl::GetFlag(FLAGS_audit_fraction) <= 1))
    return fail("--audit_fraction must be in [0, 1]");
  if (!(absl::GetFlag(FLAGS_audit_blocks) >= 0 && absl::GetFlag(FLAGS_audit_blocks) <= 1))
    return fail("--audit_blocks must be in [0, 1]");
  if (o.max_concurrent_streams < 0) return fail("--max_concurrent_streams must be >= 0");
  {
    const int64_t total = absl::GetFlag(FLAGS_max_connections), per = absl::GetFlag(FLAGS_max_connections_per_client);
    if (total < 0 || total > 1000000 || per < 0 || per > 1000000)
      return fail("--max_connections and --max_connections_per_client must be 0..1000000");
    // below the open-file limit, so that an accept never fails for want of one
    const int64_t room = fd_limit > 0 ? std::max<int64_t>(16, fd_limit - kReservedFds) : 1000000;
    if (total == 0 || total > room) {
      if (total > room)
        std::fprintf(stderr, "wmserve: --max_connections %lld lowered to %lld: the open-file limit is %lld\n",
                     static_cast<long long>(total), static_cast<long long>(room), static_cast<long long>(fd_limit));
      o.connections.max_total = static_cast<int>(room);
    } else {
      o.connections.max_total = static_cast<int>(total);
    }
    o.connections.max_per_client = static_cast<int>(per);
    const double rate = absl::GetFlag(FLAGS_client_connection_rate);
    const int burst = absl::GetFlag(FLAGS_client_connection_burst);
    if (!(rate >= 0 && rate <= 1e6)) return fail("--client_connection_rate must be 0..1000000");
    if (burst < 1 || burst > 1000000) return fail("--client_connection_burst must be 1..1000000");
    o.connections.rate_per_client = rate;
    o.connections.burst_per_client = burst;
    const int calls = absl::GetFlag(FLAGS_max_calls_per_connection);
    if (calls < 0 || calls > 1000000) return fail("--max_calls_per_connection must be 0..1000000");
    o.connections.max_calls_per_s = calls;
  }
  if (o.encoder_threads < 1 || o.encoder_threads > 64) return fail("--encoder_threads must be 1..64");
  if (!wm::threads_in_range(o.worker.engine.threads)) return fail(wm::kThreadsRange);
  // each queued action is held in memory: a bound a client cannot push past
  if (o.worker.action_queue < 1 || o.worker.action_queue > 4096) return fail("--action_queue must be 1..4096");
  if (o.sessions.max_sessions < 0 || o.sessions.max_sessions_per_client < 0)
    return fail("--max_sessions and --max_sessions_per_client must be >= 0");
  // durations become int64 nanoseconds: 30 days is far inside, NaN and 1e300 are not (checked before converting)
  constexpr double kMaxTtlS = 30 * 86400.0;
  if (!(absl::GetFlag(FLAGS_idle_ttl_s) >= 0 && absl::GetFlag(FLAGS_idle_ttl_s) <= kMaxTtlS))
    return fail("--idle_ttl_s must be 0..2592000 (30 days)");
  if (!(absl::GetFlag(FLAGS_park_ttl_s) >= 0 && absl::GetFlag(FLAGS_park_ttl_s) <= kMaxTtlS))
    return fail("--park_ttl_s must be 0..2592000 (30 days)");
  if (o.service.limits.default_jpeg_quality < 1 || o.service.limits.default_jpeg_quality > 100)
    return fail("--jpeg_quality must be 1..100");
  if (!(o.service.limits.max_fps >= wm::server::kMinFixedRateFps &&
        o.service.limits.max_fps <= wm::server::kMaxFixedRateFps))
    return fail("--max_fps must be 0.001..1000");
  if (o.service.limits.max_prompt_frames < 0 || o.service.limits.max_prompt_frames > 256)
    return fail("--max_prompt_frames must be 0..256");
  if (!(o.sessions.client_prompt_rate >= 0 && o.sessions.client_prompt_rate <= 1e6))
    return fail("--client_prompt_rate must be 0..1000000 frames a second");
  if (o.sessions.client_prompt_burst < 1 || o.sessions.client_prompt_burst > 1000000)
    return fail("--client_prompt_burst must be 1..1000000");
  // a Start the bucket can never pay for would be refused forever
  if (o.sessions.client_prompt_rate > 0 && o.sessions.client_prompt_burst < o.service.limits.max_prompt_frames)
    return fail(absl::StrCat("--client_prompt_burst ", o.sessions.client_prompt_burst, " is below --max_prompt_frames ",
                             o.service.limits.max_prompt_frames, ": a Start with that many prompt frames could never be admitted"));
  if (!(absl::GetFlag(FLAGS_start_timeout_s) >= 0 && absl::GetFlag(FLAGS_start_timeout_s) <= 86400))
    return fail("--start_timeout_s must be 0..86400");
  if (o.service.max_request_bytes < 1024 || o.service.max_request_bytes > (int64_t{1} << 30))
    return fail("--max_request_bytes must be 1 KiB..1 GiB");
  // gRPC takes them in milliseconds, as an int: beyond some 24 days they would wrap
  for (const auto& [name, value] : {std::pair{"--keepalive_time_s", o.keepalive.time_s},
                                    std::pair{"--keepalive_timeout_s", o.keepalive.timeout_s},
                                    std::pair{"--min_client_ping_interval_s", o.keepalive.min_client_ping_interval_s}})
    if (value < 1 || value > wm::server::kMaxKeepaliveSeconds)
      return fail(absl::StrCat(name, " must be 1..", wm::server::kMaxKeepaliveSeconds, " s"));
  if (o.handshake_timeout_s < 1 || o.handshake_timeout_s > 300) return fail("--handshake_timeout_s must be 1..300");
  const double grace = absl::GetFlag(FLAGS_shutdown_grace_s);
  if (!(grace >= 0 && grace <= 3600)) return fail("--shutdown_grace_s must be 0..3600");
  // TLS files are read and checked now: gRPC would only fail to listen, or fail every handshake
  {
    const std::string cert = absl::GetFlag(FLAGS_tls_cert), key = absl::GetFlag(FLAGS_tls_key),
                      ca = absl::GetFlag(FLAGS_tls_client_ca);
    if (cert.empty() != key.empty()) return fail("--tls_cert and --tls_key go together");
    if (!ca.empty() && cert.empty()) return fail("--tls_client_ca needs --tls_cert and --tls_key");
    if (!cert.empty()) {
      auto pair = wm::read_key_pair(cert, key);
      if (!pair.ok()) return fail(std::string(pair.status().message()));
      o.tls.cert_chain = std::move(pair->cert_chain);
      o.tls.private_key = std::move(pair->private_key);
      o.tls.cert_path = cert;
      o.tls.key_path = key;
      o.tls.client_ca_path = ca;
      o.tls.reload_s = absl::GetFlag(FLAGS_tls_reload_s);
      if (o.tls.reload_s < 0 || o.tls.reload_s > 86400) return fail("--tls_reload_s must be 0..86400");
      if (!ca.empty()) {
        auto cas = wm::read_certificates(ca, "--tls_client_ca", wm::CertRole::kTrustedCas);
        if (!cas.ok()) return fail(std::string(cas.status().message()));
        o.tls.client_ca = std::move(*cas);
      }
    }
  }
  if (const std::string path = absl::GetFlag(FLAGS_metrics_auth); !path.empty()) {
    if (o.metrics_port < 0) return fail("--metrics_auth needs the metrics endpoint (--metrics_port is -1)");
    auto table = load_tokens("metrics_auth", path);
    if (!table.ok()) return fail(std::string(table.status().message()));
    o.metrics_auth = *std::move(table);
  }
  if (const std::string path = absl::GetFlag(FLAGS_auth_tokens); !path.empty()) {
    auto tokens = load_tokens("auth_tokens", path);
    if (!tokens.ok()) return fail(std::string(tokens.status().message()));
    o.service.tokens = *std::move(tokens);
    if (!o.tls.enabled())
      std::fprintf(stderr, "wmserve: warning: API tokens without TLS (--tls_cert) cross the network in the clear\n");
  }
  // converted only once in range: a double beyond int64 nanoseconds does not convert
  o.worker.max_batch_wait = wm::server::from_seconds(absl::GetFlag(FLAGS_max_batch_wait_ms) / 1000.0);
  o.sessions.idle_ttl = wm::server::from_seconds(absl::GetFlag(FLAGS_idle_ttl_s));
  o.sessions.park_ttl = wm::server::from_seconds(absl::GetFlag(FLAGS_park_ttl_s));
  o.service.start_timeout = wm::server::from_seconds(absl::GetFlag(FLAGS_start_timeout_s));

  // a client can make gRPC log a line per failed handshake, at will
  wm::server::limit_grpc_log(kGrpcLogLinesPerSecond);
  auto server = wm::server::Server::start(o);
  if (!server.ok()) return fail(std::string(server.status().message()));
  const wm::server::ServedModel& m = (*server)->model();
  std::printf("wmserve %s: model '%s' (%s, %lld parameters, %dx%d, %d frame(s)/block) on %s, %s KV budget %lld bytes\n",
              WM_VERSION, m.config.name.c_str(), model.c_str(), static_cast<long long>(m.parameters), m.config.width,
              m.config.height, m.config.frames_per_block, m.device.c_str(), m.default_format.c_str(),
              static_cast<long long>(m.kv_capacity_bytes));
  if (!m.device_note.empty()) std::printf("wmserve: device: %s\n", m.device_note.c_str());
  std::printf("wmserve: host GEMMs: %s, %d thread(s)\n", wm::blas::describe().c_str(),
              wm::cpu_threads_used(o.worker.engine.threads));
  std::printf("wmserve: listening on %s:%d%s", o.host.c_str(), (*server)->port(),
              o.tls.enabled() ? (o.tls.client_ca.empty() ? " (TLS)" : " (TLS, client certificates required)") : "");
  if ((*server)->metrics_port() >= 0)
    std::printf(", metrics on http://%s:%d/metrics", o.metrics_host.c_str(), (*server)->metrics_port());
  std::printf("\n");
  std::fflush(stdout);
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    const std::string path = absl::GetFlag(FLAGS_port_file);
    const std::string text =
        absl::StrCat("{\"port\": ", (*server)->port(), ", \"metrics_port\": ", (*server)->metrics_port(), "}\n");
    // written whole, then renamed: a reader never sees half a file
    const std::string tmp = path + ".tmp";
    if (auto st = wm::write_file(tmp, text.data(), text.size()); !st.ok()) return fail(std::string(st.message()));
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) return fail(absl::StrCat("cannot write ", path, ": ", ec.message()));
  }

  int sig = 0;
  for (;;) {
    sig = wait_signal(signals, 200);
    if (sig == SIGHUP) reload(**server, absl::GetFlag(FLAGS_auth_tokens), absl::GetFlag(FLAGS_metrics_auth));
    if (sig == SIGINT || sig == SIGTERM) break;
    (*server)->sweep_idle();
  }

  // parked sessions have no stream to finish on: draining closes them at once
  const auto [held, parked] = (*server)->sessions_and_parked();
  std::printf("wmserve: %s: draining, %d session(s) get %.1f s to finish, %d parked one(s) end now\n",
              sig == SIGINT ? "SIGINT" : "SIGTERM", held - parked, grace, parked);
  std::fflush(stdout);
  (*server)->begin_drain(grace);
  const auto deadline = std::chrono::steady_clock::now() + wm::server::from_seconds(grace);
  while ((*server)->sessions() > 0 && std::chrono::steady_clock::now() < deadline) {
    if (const int again = wait_signal(signals, 50); again == SIGINT || again == SIGTERM) {
      std::printf("wmserve: second signal: ending sessions now\n");
      break;
    }
    (*server)->sweep_idle();
  }
  (*server)->shutdown(std::chrono::seconds(2));
  std::printf("wmserve: stopped\n");
  std::fflush(stdout);
  return 0;
}
