// Bookkeeping of the device KV page pool: which pages are free, which owner
// (one session's cache) holds which, and how many each owner may still take.
// Pure host code, no device memory: the CUDA backend pairs it with one device
// allocation of capacity() * page_bytes made once at start-up.
//
// An owner opens with a reservation (its worst case, what admission checks),
// then takes pages one by one as its cache grows (never more than reserved),
// and gives everything back at close. Taking can therefore never fail once an
// owner is open: no allocation, and no failure, on the step path.
//
// Threading: one thread (the engine thread).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace wm::cuda {

class PagePool {
 public:
  using Owner = int64_t;

  explicit PagePool(int32_t capacity_pages = 0);

  int32_t capacity() const { return capacity_; }
  int32_t reserved() const { return reserved_; }  // promised to open owners (taken or not)
  int32_t used() const { return used_; }          // taken
  int32_t unreserved() const { return capacity_ - reserved_; }
  size_t owners() const { return owners_.size(); }

  // RESOURCE_EXHAUSTED when fewer than `pages` are unreserved
  absl::StatusOr<Owner> open(int64_t pages);
  // one more page for `owner`, lowest free index first; FAILED_PRECONDITION
  // when the owner is unknown or has taken its whole reservation
  absl::StatusOr<int32_t> take(Owner owner);
  // returns the owner's pages and reservation; unknown owners are ignored
  void close(Owner owner);
  // returns pages the owner took but did not use (a failed append); its
  // reservation stays. FAILED_PRECONDITION, changing nothing, when the owner
  // is unknown or does not hold one of them
  absl::Status put_back(Owner owner, std::span<const int32_t> pages);

  int32_t owner_reserved(Owner owner) const;
  const std::vector<int32_t>& owner_pages(Owner owner) const;
  // every invariant, for tests: counts agree, each page free xor owned once
  bool check() const;

 private:
  struct Account {
    int32_t reserved = 0;
    std::vector<int32_t> pages;
  };
  int32_t capacity_;
  int32_t reserved_ = 0;
  int32_t used_ = 0;
  Owner next_owner_ = 1;
  std::vector<int32_t> free_;  // a min-heap: the lowest free index is handed out first
  std::unordered_map<Owner, Account> owners_;
};

}  // namespace wm::cuda
