#include "cuda/kv_pages.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cuda/kv_layout.h"

namespace wm::cuda {

absl::Status validate_paged_geometry(const PagedGeometry& g) {
  if (g.layers <= 0 || g.heads <= 0 || g.tokens_per_frame <= 0 || g.window_frames <= 0 || g.sink_frames < 0)
    return absl::InvalidArgumentError("device kv cache: bad geometry");
  if (g.head_dim != 32 && g.head_dim != 64 && g.head_dim != 128)
    return absl::UnimplementedError(
        absl::StrCat("device kv cache: head_dim ", g.head_dim, " has no CUDA attention kernel (32, 64 or 128)"));
  if (g.page_tokens <= 0 || g.page_tokens % kTileKeys != 0)
    return absl::InvalidArgumentError(absl::StrCat("device kv cache: ", g.page_tokens,
                                                   " tokens per page is not a positive multiple of ", kTileKeys));
  const int64_t tokens = static_cast<int64_t>(g.slots()) * g.tokens_per_frame;
  if (tokens > (int64_t{1} << 30)) return absl::InvalidArgumentError("device kv cache: window too long");
  if (g.kivi.group > 0 && g.kivi.front_tokens() != g.sink_frames * g.tokens_per_frame)
    return absl::InvalidArgumentError("device kv cache: the sink frames must be whole units of keys");
  if (g.span.block > 0 && g.span.front_tokens % kTileKeys != 0)
    return absl::InvalidArgumentError("device kv cache: the sink frames must be whole units of keys");
  return absl::OkStatus();
}

KvPages::KvPages(const PagedGeometry& g)
    : g_(g),
      next_frame_(static_cast<size_t>(g.layers), 0),
      version_(static_cast<size_t>(g.layers), 0),
      slot_frame_(static_cast<size_t>(g.layers), std::vector<int64_t>(static_cast<size_t>(g.slots()), -1)),
      pages_(static_cast<size_t>(g.layers) * g.heads) {}

int32_t KvPages::slot_of(int64_t frame) const {
  if (frame < g_.sink_frames) return static_cast<int32_t>(frame);
  return g_.sink_frames + static_cast<int32_t>((frame - g_.sink_frames) % g_.window_frames);
}

absl::StatusOr<KvAppendPlan> KvPages::plan_append(int32_t layer, int64_t first_frame, int32_t frames) const {
  if (layer < 0 || layer >= g_.layers)
    return absl::InvalidArgumentError(absl::StrCat("kv append: layer ", layer, " of ", g_.layers));
  if (frames < 0) return absl::InvalidArgumentError("kv append: negative frame count");
  const int64_t next = next_frame_[static_cast<size_t>(layer)];
  if (first_frame != next)
    return absl::FailedPreconditionError(absl::StrCat("kv append: layer ", layer, " expects frame ", next,
                                                      " next, got ", first_frame,
                                                      " (the device cache takes frames in order)"));
  KvAppendPlan p;
  p.layer = layer;
  p.end_frame = first_frame + frames;
  for (int32_t i = 0; i < frames; ++i) {
    const int64_t f = first_frame + i;
    // a frame this very append pushes out is never written (two frames of
    // one append must not race for one slot)
    if (f < g_.sink_frames || f >= p.end_frame - g_.window_frames) {
      p.src_frame.push_back(i);
      p.slot.push_back(slot_of(f));
    }
  }
  const int64_t used_after = std::min<int64_t>(p.end_frame, g_.slots());
  const int32_t need = g_.pages_for(used_after * g_.tokens_per_frame);
  p.new_pages_per_head = std::max(0, need - pages_per_head(layer));
  return p;
}

void KvPages::commit_append(const KvAppendPlan& p, const std::vector<int32_t>& new_pages) {
  const size_t L = static_cast<size_t>(p.layer);
  for (int32_t h = 0; h < g_.heads; ++h) {
    auto& list = pages_[L * g_.heads + h];
    for (int32_t i = 0; i < p.new_pages_per_head; ++i)
      list.push_back(new_pages[static_cast<size_t>(h) * p.new_pages_per_head + i]);
  }
  const int64_t first = next_frame_[L];
  for (size_t w = 0; w < p.slot.size(); ++w)
    slot_frame_[L][static_cast<size_t>(p.slot[w])] = first + p.src_frame[w];
  next_frame_[L] = p.end_frame;
  ++version_[L];
}

int32_t KvPages::used_slots(int32_t layer) const {
  return static_cast<int32_t>(std::min<int64_t>(next_frame_[static_cast<size_t>(layer)], g_.slots()));
}

int32_t KvPages::pages_per_head(int32_t layer) const { return static_cast<int32_t>(pages(layer, 0).size()); }

int64_t KvPages::pages_held() const {
  int64_t n = 0;
  for (const auto& p : pages_) n += static_cast<int64_t>(p.size());
  return n;
}

std::vector<int64_t> KvPages::slot_frames(int32_t layer) const {
  const auto& s = slot_frame_[static_cast<size_t>(layer)];
  return std::vector<int64_t>(s.begin(), s.begin() + used_slots(layer));
}

std::vector<int64_t> KvPages::frames(int32_t layer) const {
  std::vector<int64_t> f = slot_frames(layer);
  std::sort(f.begin(), f.end());
  return f;
}

}  // namespace wm::cuda
