// wmhealth: a grpc.health.v1 probe (grpc_health_probe is not in Debian).
//   wmhealth [--server host:port] [--service wmserve.v1.admit] [--wait_s 30]
// Exit 0 once the service is SERVING, 1 otherwise (after --wait_s).
#include <cstdio>
#include <thread>

#include "common/cli.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "clients/play_client.h"
#include "clients/connection_flags.h"

ABSL_FLAG(std::string, server, "localhost:50051", "wmserve address host:port");
ABSL_FLAG(std::string, service, "", "\"\": the server is live; \"wmserve.v1.admit\": it admits new sessions");
ABSL_FLAG(double, wait_s, 0, "retry until SERVING for this long");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("wmhealth [--server host:port] [--service NAME] [--wait_s S]: exit 0 when SERVING");
  if (auto bad = wm::parse_flags_only(argc, argv)) {
    std::fprintf(stderr, "wmhealth: %s\n", bad->c_str());
    return 2;
  }
  // becomes int64 milliseconds: a day is far inside, NaN and 1e300 are not
  if (!(absl::GetFlag(FLAGS_wait_s) >= 0 && absl::GetFlag(FLAGS_wait_s) <= 86400)) {
    std::fprintf(stderr, "wmhealth: --wait_s must be 0..86400\n");
    return 2;
  }
  if (auto st = wm::client::check_server_address(absl::GetFlag(FLAGS_server)); !st.ok()) {
    std::fprintf(stderr, "wmhealth: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  wm::client::ChannelOptions channel_options;
  if (auto st = wm::client::apply_connection_flags(&channel_options); !st.ok()) {
    std::fprintf(stderr, "wmhealth: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  auto channel = wm::client::make_channel(absl::GetFlag(FLAGS_server), channel_options);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_wait_s) * 1000));
  static const char* names[] = {"UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"};
  for (;;) {
    const auto r = wm::client::health_check(channel, absl::GetFlag(FLAGS_service), std::chrono::seconds(2));
    if (r.serving()) {
      std::printf("SERVING\n");
      return 0;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      if (!r.status.ok())
        std::printf("%s: %s\n", wm::client::status_code_name(r.status.error_code()), r.status.error_message().c_str());
      else
        std::printf("%s\n", names[r.serving_status & 3]);
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}
