#pragma once
// Complex element types: meshtensor::complex<float> and complex<double>, Kokkos::complex.
//
// Why Kokkos::complex and not std::complex: a tensor's elements are read and written in kernels on
// every backend, and std::complex's members are host functions (nvcc calls them from device code
// only under --expt-relaxed-constexpr, and not its transcendental functions). Kokkos::complex holds
// the real part then the imaginary part, as std::complex does ([complex.numbers]: an array of two
// T), and as BLAS's cgemm/zgemm, FFTW and MPI's MPI_C_*_COMPLEX read them: a host buffer of
// std::complex<double> is converted element by element with to_std/from_std, or read in place.
//
// Gradients follow PyTorch's convention (the conjugate Wirtinger derivative): for a real loss L of
// z = x + iy, the gradient held for z is dL/dx + i dL/dy, and a holomorphic f passes back
// g * conj(f'(z)) (docs/design/types.md, "Element types"). Ops that are not defined on complex
// values (an order: max, softmax, relu; or without a complex form here: sigmoid, tanh) refuse
// them at compile time, naming the op.
#include <Kokkos_Core.hpp>
#include <complex>
#include <type_traits>

namespace meshtensor {

template <class T>
using complex = Kokkos::complex<T>;

template <class T>
inline constexpr bool is_complex_v = false;
template <class T>
inline constexpr bool is_complex_v<Kokkos::complex<T>> = true;

// The real type under an element type: T for real T, T for complex<T>.
template <class T>
struct real_of {
  using type = T;
};
template <class T>
struct real_of<Kokkos::complex<T>> {
  using type = T;
};
template <class T>
using real_of_t = typename real_of<T>::type;

namespace detail {
// conj(x) for complex x; x itself for a real one (the gradient rules apply it to every type).
template <class T>
KOKKOS_INLINE_FUNCTION T conj_value(const T& x) {
  if constexpr (is_complex_v<T>)
    return Kokkos::conj(x);
  else
    return x;
}
// conj_value as a functor, for the map kernels.
struct conj_fn {
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(T x) const {
    return conj_value(x);
  }
};
}  // namespace detail

template <class T>
std::complex<T> to_std(const Kokkos::complex<T>& z) {
  return {z.real(), z.imag()};
}
template <class T>
Kokkos::complex<T> from_std(const std::complex<T>& z) {
  return {z.real(), z.imag()};
}

static_assert(sizeof(complex<double>) == sizeof(std::complex<double>) &&
              sizeof(complex<float>) == sizeof(std::complex<float>));

}  // namespace meshtensor
