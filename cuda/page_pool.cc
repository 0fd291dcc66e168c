#include "cuda/page_pool.h"

#include <algorithm>
#include <functional>

#include "absl/strings/str_cat.h"

namespace wm::cuda {

PagePool::PagePool(int32_t capacity_pages) : capacity_(std::max<int32_t>(0, capacity_pages)) {
  // ascending order is already a min-heap
  free_.reserve(static_cast<size_t>(capacity_));
  for (int32_t p = 0; p < capacity_; ++p) free_.push_back(p);
}

absl::StatusOr<PagePool::Owner> PagePool::open(int64_t pages) {
  if (pages < 0) return absl::InvalidArgumentError("page reservation must not be negative");
  if (pages > unreserved())
    return absl::ResourceExhaustedError(absl::StrCat("KV page pool full: a cache needs ", pages, " pages, ",
                                                     unreserved(), " of ", capacity_, " are unreserved"));
  const Owner id = next_owner_++;
  owners_[id].reserved = static_cast<int32_t>(pages);
  reserved_ += static_cast<int32_t>(pages);
  return id;
}

absl::StatusOr<int32_t> PagePool::take(Owner owner) {
  auto it = owners_.find(owner);
  if (it == owners_.end()) return absl::FailedPreconditionError(absl::StrCat("page pool: unknown owner ", owner));
  Account& a = it->second;
  if (static_cast<int32_t>(a.pages.size()) >= a.reserved)
    return absl::FailedPreconditionError(
        absl::StrCat("page pool: owner ", owner, " has taken all ", a.reserved, " reserved pages"));
  // reserved pages always exist: reserved_ <= capacity_ and used_ <= reserved_
  std::pop_heap(free_.begin(), free_.end(), std::greater<int32_t>());
  const int32_t page = free_.back();
  free_.pop_back();
  a.pages.push_back(page);
  ++used_;
  return page;
}

void PagePool::close(Owner owner) {
  auto it = owners_.find(owner);
  if (it == owners_.end()) return;
  Account& a = it->second;
  used_ -= static_cast<int32_t>(a.pages.size());
  reserved_ -= a.reserved;
  for (int32_t p : a.pages) {
    free_.push_back(p);
    std::push_heap(free_.begin(), free_.end(), std::greater<int32_t>());
  }
  owners_.erase(it);
}

absl::Status PagePool::put_back(Owner owner, std::span<const int32_t> pages) {
  auto it = owners_.find(owner);
  if (it == owners_.end()) return absl::FailedPreconditionError(absl::StrCat("page pool: unknown owner ", owner));
  std::vector<int32_t>& held = it->second.pages;
  for (int32_t p : pages)
    if (std::find(held.begin(), held.end(), p) == held.end())
      return absl::FailedPreconditionError(absl::StrCat("page pool: owner ", owner, " does not hold page ", p));
  for (int32_t p : pages) {
    held.erase(std::find(held.begin(), held.end(), p));
    free_.push_back(p);
    std::push_heap(free_.begin(), free_.end(), std::greater<int32_t>());
    --used_;
  }
  return absl::OkStatus();
}

int32_t PagePool::owner_reserved(Owner owner) const {
  auto it = owners_.find(owner);
  return it == owners_.end() ? 0 : it->second.reserved;
}

const std::vector<int32_t>& PagePool::owner_pages(Owner owner) const {
  static const std::vector<int32_t> none;
  auto it = owners_.find(owner);
  return it == owners_.end() ? none : it->second.pages;
}

bool PagePool::check() const {
  std::vector<int> seen(static_cast<size_t>(capacity_), 0);
  int64_t reserved = 0, used = 0;
  for (int32_t p : free_) {
    if (p < 0 || p >= capacity_) return false;
    ++seen[static_cast<size_t>(p)];
  }
  for (const auto& [id, a] : owners_) {
    if (static_cast<int32_t>(a.pages.size()) > a.reserved) return false;
    reserved += a.reserved;
    used += static_cast<int64_t>(a.pages.size());
    for (int32_t p : a.pages) {
      if (p < 0 || p >= capacity_) return false;
      ++seen[static_cast<size_t>(p)];
    }
  }
  for (int s : seen)
    if (s != 1) return false;
  if (!std::is_heap(free_.begin(), free_.end(), std::greater<int32_t>())) return false;
  return reserved == reserved_ && used == used_ && reserved_ <= capacity_ &&
         static_cast<int64_t>(free_.size()) == capacity_ - used_;
}

}  // namespace wm::cuda
