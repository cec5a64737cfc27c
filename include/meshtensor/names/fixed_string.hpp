#pragma once
// A string usable as a template argument, so that names are part of types.
#include <algorithm>
#include <cstddef>
#include <string_view>

namespace meshtensor {

template <std::size_t N>
struct fixed_string {
  char chars[N]{};
  constexpr fixed_string(const char (&s)[N]) { std::copy_n(s, N, chars); }
  constexpr std::string_view view() const { return {chars, N - 1}; }
  constexpr auto operator<=>(const fixed_string&) const = default;
};

}  // namespace meshtensor
