// The budget of gRPC's log lines.
#include "server/grpc_log.h"

#include <gtest/gtest.h>

namespace wm::server {
namespace {

TEST(LogLimiter, KeepsToItsLinesPerSecondAndCountsWhatItDropped) {
  LogLimiter l(3);
  const TimePoint t0{};
  auto at = [&](double s) { return t0 + from_seconds(s); };
  struct Step {
    double at_s;
    bool admitted;
    int64_t dropped;  // reported with an admitted line
  };
  const Step steps[] = {
      {0.0, true, 0},  {0.1, true, 0},  {0.2, true, 0},   // the budget
      {0.3, false, 0}, {0.9, false, 0},                   // dropped
      {1.0, true, 2},                                     // a new second: the drops are told once
      {1.1, true, 0},  {1.2, true, 0},  {1.3, false, 0},
      {5.0, true, 1},  {0.5, true, 0},                    // a clock that went back starts a window
  };
  int i = 0;
  for (const Step& s : steps) {
    SCOPED_TRACE(testing::Message() << "step " << i++);
    int64_t dropped = -1;
    EXPECT_EQ(l.admit(at(s.at_s), &dropped), s.admitted);
    EXPECT_EQ(dropped, s.admitted ? s.dropped : 0);
  }
}

}  // namespace
}  // namespace wm::server
