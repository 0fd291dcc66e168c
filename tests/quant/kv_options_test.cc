// The format options as text (--kv_options): every knob by name, the
// canonical text back, and each kind of mistake refused with its item named.
#include "quant/kv_options.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"

namespace wm {
namespace {

TEST(KvOptions, SetsEachKnobByNameAndPrintsTheChangedOnes) {
  EXPECT_EQ(kv_format_options_text({}), "");
  auto none = parse_kv_format_options("  ");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(kv_format_options_text(*none), "");

  const std::string all =
      "span_frames=2,centroids=16,tokens_per_centroid=16,block=32,kmeans_iters=6,psac_bits=4,"
      "psac_refresh_frames=8,kivi_group=64,kivi_residual=128,quantize_sinks=true";
  auto o = parse_kv_format_options(all);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->span_frames, 2);
  EXPECT_EQ(o->centroids, 16);
  EXPECT_EQ(o->tokens_per_centroid, 16);
  EXPECT_EQ(o->block, 32);
  EXPECT_EQ(o->kmeans_iters, 6);
  EXPECT_EQ(o->psac_bits, 4);
  EXPECT_EQ(o->psac_refresh_frames, 8);
  EXPECT_EQ(o->kivi_group, 64);
  EXPECT_EQ(o->kivi_residual, 128);
  EXPECT_TRUE(o->quantize_sinks);
  EXPECT_EQ(kv_format_options_text(*o), all);
  // what the text does not name keeps its value, spaces around items are fine
  auto some = parse_kv_format_options(" psac_bits = 4 , block=32 ");
  ASSERT_TRUE(some.ok()) << some.status();
  EXPECT_EQ(kv_format_options_text(*some), "block=32,psac_bits=4");
  EXPECT_EQ(some->tokens_per_centroid, KvFormatOptions().tokens_per_centroid);
  EXPECT_TRUE(some->qsac && some->psac);
  // a default value named is not printed
  EXPECT_EQ(kv_format_options_text(*parse_kv_format_options("block=64,quantize_sinks=false")), "");
}

TEST(KvOptions, RefusesMistakesNamingTheItem) {
  struct Case {
    const char* text;
    const char* says;
  };
  const Case cases[] = {
      {"block", "'block': expected name=value"},
      {"block=48", "'block=48': block is one of 16, 32, 64, 128"},
      {"block=256", "block is one of 16, 32, 64, 128"},
      {"psac_bits=2", "psac_bits is one of 4, 8"},
      {"kivi_group=16", "kivi_group is one of 32, 64, 128"},
      {"centroids=0", "centroids is within 1..256"},
      {"centroids=257", "centroids is within 1..256"},
      {"kmeans_iters=1001", "kmeans_iters is within 0..1000"},
      {"kmeans_iters=-1", "kmeans_iters is within 0..1000"},
      {"psac_refresh_frames=0", "psac_refresh_frames is within 1..1024"},
      {"kivi_residual=99999999999999999999", "kivi_residual is an integer"},
      {"tokens_per_centroid=1.5", "tokens_per_centroid is an integer"},
      {"block=", "block is an integer"},
      {"quantize_sinks=yes", "quantize_sinks is true or false"},
      {"psac_rank=4", "'psac_rank=4': unknown option; known: span_frames"},
      {"block=32,,psac_bits=4", "an empty item"},
      {"block=32,", "an empty item"},
      {"block=32,block=16", "'block=16': set twice"},
  };
  for (const Case& c : cases) {
    auto o = parse_kv_format_options(c.text);
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_TRUE(absl::StrContains(o.status().message(), c.says)) << c.text << ": " << o.status();
  }
}

// a knob can be fine on its own and still not fit a model: the format says why
TEST(KvOptions, FormatCheckSaysWhatDoesNotFitTheGeometry) {
  KvGeometry g;
  g.layers = 2;
  g.heads = 2;
  g.head_dim = 64;
  g.tokens_per_frame = 16;
  g.window_frames = 4;
  g.sink_frames = 1;
  EXPECT_TRUE(kv_format_check("qvg2", g).ok());
  KvFormatOptions o;
  o.kivi_group = 128;
  const absl::Status kivi = kv_format_check("kivi2", g, o);
  EXPECT_EQ(kivi.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kivi.message(), "kivi2: group 128 does not divide head_dim 64");
  o = {};
  o.span_frames = 5;
  const absl::Status span = kv_format_check("quantwm2", g, o);
  EXPECT_TRUE(absl::StrContains(span.message(), "quantwm2: span_frames 5 must be within 0..window (4")) << span;
  EXPECT_TRUE(kv_format_check("fp16", g, o).ok());  // options it does not use
  EXPECT_EQ(kv_format_check("q3", g).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace wm
