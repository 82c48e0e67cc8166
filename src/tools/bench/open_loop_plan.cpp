#include "tools/bench/open_loop_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <set>
#include <string>

namespace ferry::bench {
namespace {

error bad_mix(std::string_view entry, const std::string& what) {
  return {errc::invalid_request, fmt::format("--mix entry '{}': {}", entry, what)};
}

}  // namespace

result<std::vector<mix_class>> parse_mix(std::string_view text) {
  std::vector<mix_class> out;
  if (text.empty())
    return error{errc::invalid_request,
                 "--mix is empty: expected TOKENS:FRACTION[,TOKENS:FRACTION...], e.g. "
                 "16:0.9,4096:0.1"};
  std::set<uint32_t> seen;
  double sum = 0;
  for (size_t at = 0; at <= text.size();) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string_view entry = text.substr(at, comma - at);
    at = comma + 1;
    const size_t colon = entry.find(':');
    if (colon == std::string_view::npos)
      return bad_mix(entry, "expected TOKENS:FRACTION, e.g. 4096:0.09");
    const std::string_view tokens_text = entry.substr(0, colon);
    const std::string fraction_text(entry.substr(colon + 1));
    mix_class c;
    auto [end, ec] =
        std::from_chars(tokens_text.data(), tokens_text.data() + tokens_text.size(), c.tokens);
    if (ec != std::errc{} || end != tokens_text.data() + tokens_text.size() || c.tokens == 0)
      return bad_mix(entry, "the token count must be a positive integer");
    size_t used = 0;
    try {
      c.fraction = std::stod(fraction_text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != fraction_text.size() || !std::isfinite(c.fraction))
      return bad_mix(entry, "the fraction must be a number");
    if (c.fraction <= 0 || c.fraction > 1)
      return bad_mix(entry, fmt::format("the fraction must be in (0, 1], got {}", c.fraction));
    if (!seen.insert(c.tokens).second)
      return bad_mix(entry, fmt::format("{} tokens appear more than once", c.tokens));
    sum += c.fraction;
    out.push_back(c);
  }
  if (std::abs(sum - 1.0) > 1e-6)
    return error{errc::invalid_request,
                 fmt::format("--mix '{}': the fractions sum to {}, not 1", text, sum)};
  return out;
}

arrival_schedule::arrival_schedule(double rate, const std::vector<mix_class>& mix, uint64_t seed)
    : rng_(seed), gap_(rate) {
  double sum = 0;
  for (const auto& c : mix) cumulative_.push_back(sum += c.fraction);
}

arrival_schedule::arrival arrival_schedule::next() {
  arrival a;
  now_s_ += gap_(rng_);
  a.at_s = now_s_;
  const double u = pick_(rng_) * cumulative_.back();
  a.klass = static_cast<size_t>(std::upper_bound(cumulative_.begin(), cumulative_.end(), u) -
                                cumulative_.begin());
  a.klass = std::min(a.klass, cumulative_.size() - 1);
  return a;
}

page_allocator::page_allocator(uint32_t first, uint32_t count) : first_(first), count_(count) {
  if (count > 0) runs_.emplace(first, count);
  free_ = count;
}

std::optional<std::vector<uint32_t>> page_allocator::allocate(uint32_t n, bool* fragmented) {
  if (n > free_) return std::nullopt;
  std::vector<uint32_t> out;
  out.reserve(n);
  auto take = [&](std::map<uint32_t, uint32_t>::iterator it, uint32_t k) {
    const uint32_t start = it->first, len = it->second;
    for (uint32_t i = 0; i < k; ++i) out.push_back(start + i);
    runs_.erase(it);
    if (k < len) runs_.emplace(start + k, len - k);
    free_ -= k;
  };
  for (auto it = runs_.begin(); it != runs_.end(); ++it)
    if (it->second >= n) {
      take(it, n);
      if (fragmented) *fragmented = false;
      return out;
    }
  while (out.size() < n) {  // no run is long enough: the free pages in address order
    auto it = runs_.begin();
    take(it, std::min<uint32_t>(it->second, n - static_cast<uint32_t>(out.size())));
  }
  if (fragmented) *fragmented = true;
  return out;
}

bool page_allocator::release(const std::vector<uint32_t>& pages) {
  // Check every page first (outside, free, or given twice): nothing changes on an error.
  std::vector<uint32_t> sorted(pages);
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    const uint32_t p = sorted[i];
    if (p < first_ || p - first_ >= count_ || (i > 0 && sorted[i - 1] == p)) return false;
    auto after = runs_.upper_bound(p);
    if (after != runs_.begin() && p < std::prev(after)->first + std::prev(after)->second)
      return false;
  }
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i + 1;
    while (j < sorted.size() && sorted[j] == sorted[j - 1] + 1) ++j;
    uint32_t start = sorted[i], len = static_cast<uint32_t>(j - i);
    auto after = runs_.lower_bound(start);
    if (after != runs_.end() && after->first == start + len) {  // merge with the next run
      len += after->second;
      after = runs_.erase(after);
    }
    if (after != runs_.begin()) {  // and with the previous one
      auto before = std::prev(after);
      if (before->first + before->second == start) {
        start = before->first;
        len += before->second;
        runs_.erase(before);
      }
    }
    runs_.emplace(start, len);
    free_ += j - i;
    i = j;
  }
  return true;
}

index_allocator::index_allocator(uint32_t count) : count_(count) {
  for (uint32_t i = count; i-- > 0;) free_.push_back(i);
}

std::optional<uint32_t> index_allocator::take() {
  if (free_.empty()) return std::nullopt;
  const uint32_t i = free_.back();
  free_.pop_back();
  return i;
}

bool index_allocator::give(uint32_t i) {
  if (i >= count_ || std::find(free_.begin(), free_.end(), i) != free_.end()) return false;
  free_.insert(std::upper_bound(free_.begin(), free_.end(), i, std::greater<>()), i);
  return true;
}

}  // namespace ferry::bench
