// The outbox between the engine and one write in flight: bounded frames
// (newer replace older unsent ones, counted), bounded events, order kept.
#include "server/outbox.h"

#include <gtest/gtest.h>

#include <string>

namespace wm::server {
namespace {

using Box = Outbox<std::string>;

std::vector<std::string> drain(Box& b) {
  std::vector<std::string> out;
  while (auto item = b.pop()) out.push_back(item->second);
  return out;
}

TEST(Outbox, ANewerFrameReplacesTheUnsentOneStepByStep) {
  Box b(1, 4);
  struct Step {
    const char* push;      // "f:NAME" frame, "e:NAME" event, "s:NAME" essential, "pop"
    int dropped;           // frames this push dropped
    size_t size_after;
    uint64_t dropped_total;
  };
  const Step steps[] = {
      {"s:started", 0, 1, 0}, {"f:f0", 0, 2, 0}, {"f:f1", 1, 2, 1}, {"e:warn", 0, 3, 1},
      {"f:f2", 1, 3, 2},  // f1 goes; the event stays
      {"pop", 0, 2, 2},   // started
      {"f:f3", 1, 2, 3},
  };
  for (const Step& s : steps) {
    SCOPED_TRACE(s.push);
    const std::string op(s.push);
    if (op == "pop") {
      ASSERT_TRUE(b.pop().has_value());
    } else if (op[0] == 'f') {
      EXPECT_EQ(b.push_frame(op.substr(2)), s.dropped);
    } else if (op[0] == 'e') {
      EXPECT_TRUE(b.push_event(op.substr(2)));
    } else {
      b.push_essential(op.substr(2));
    }
    EXPECT_EQ(b.size(), s.size_after);
    EXPECT_EQ(b.frames_dropped(), s.dropped_total);
  }
  EXPECT_EQ(drain(b), (std::vector<std::string>{"warn", "f3"}));
}

TEST(Outbox, ABlockOfFramesFitsAndOrderIsKept) {
  Box b(3, 4);
  EXPECT_EQ(b.push_frame("a"), 0);
  b.push_event("e1");
  EXPECT_EQ(b.push_frame("b"), 0);
  EXPECT_EQ(b.push_frame("c"), 0);
  EXPECT_EQ(b.frames(), 3u);
  EXPECT_EQ(b.push_frame("d"), 1);  // a goes
  EXPECT_EQ(drain(b), (std::vector<std::string>{"e1", "b", "c", "d"}));
}

TEST(Outbox, EventsAreBoundedButEssentialsNeverDrop) {
  Box b(1, 2);
  b.push_essential("started");
  EXPECT_TRUE(b.push_event("e1"));
  EXPECT_TRUE(b.push_event("e2"));
  EXPECT_FALSE(b.push_event("e3"));  // e1 goes
  EXPECT_EQ(b.events_dropped(), 1u);
  EXPECT_EQ(drain(b), (std::vector<std::string>{"started", "e2", "e3"}));
}

TEST(Outbox, AFirstEssentialGoesAheadOfWhatIsQueued) {
  Box b(1, 4);
  b.push_event("e1");
  b.push_event("e2");
  b.push_essential_first("started");
  b.push_event("e3");
  EXPECT_EQ(drain(b), (std::vector<std::string>{"started", "e1", "e2", "e3"}));
  // an event dropped for room is still the oldest event, not the first message
  Box c(1, 1);
  c.push_essential_first("started");
  c.push_event("e1");
  EXPECT_FALSE(c.push_event("e2"));
  EXPECT_EQ(drain(c), (std::vector<std::string>{"started", "e2"}));
}

TEST(Outbox, ClearDropsUnsentFramesAndCountsThem) {
  Box b(2, 2);
  b.push_frame("a");
  b.push_frame("b");
  b.push_event("e");
  EXPECT_EQ(b.clear(), 2);
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.frames_dropped(), 2u);
  EXPECT_FALSE(b.pop().has_value());
}

}  // namespace
}  // namespace wm::server
