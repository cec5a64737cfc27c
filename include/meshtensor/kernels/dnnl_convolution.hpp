#pragma once
// oneDNN's direct convolution for kernels::convolution_* (kernels/convolution.hpp): forward,
// backward data and backward weights on the layouts meshtensor's tensors have (any strides),
// with the weights in the format the primitive prefers (a reorder each call: a filter is small
// beside the images). Included by kernels/convolution.hpp after conv_problem.
#include "conv_problem.hpp"
#include "dnnl.hpp"

#if MESHTENSOR_HAVE_DNNL
#include <cstddef>
#include <optional>
#include <vector>

namespace meshtensor::kernels {
enum class conv_pass;
}

namespace meshtensor::kernels::dnnl_provider {

struct conv_entry {
  dnnl::primitive prim;
  dnnl::memory::desc src, weights, dst;  // meshtensor's layouts
  dnnl::memory::desc weights_internal;   // the primitive's
  std::optional<dnnl::reorder> weights_in, weights_out;
  std::vector<std::byte> weights_buffer;
  std::string implementation;
};
inline primitive_cache<conv_entry>& conv_cache() {
  static primitive_cache<conv_entry> c(cache_capacity);
  return c;
}

template <class T>
conv_entry make_conv(const conv_problem& p, int pass) {
  using dims = dnnl::memory::dims;
  const auto dt = data_type_of<T>();
  const int s = p.spatial;
  dims src_d{p.n, p.ic}, wei_d{p.oc, p.ic}, dst_d{p.n, p.oc}, strides, dilates, pad_l, pad_r;
  for (int j = 0; j < s; ++j) {
    src_d.push_back(p.in[j]);
    wei_d.push_back(p.taps[j]);
    dst_d.push_back(p.out[j]);
    strides.push_back(p.stride[j]);
    dilates.push_back(p.dilation[j] - 1);  // oneDNN counts the gaps between taps
    pad_l.push_back(p.pad_lo[j]);
    pad_r.push_back(p.pad_hi[j]);
  }
  auto strides_of = [&](const std::array<std::int64_t, 5>& a) { return dims(a.begin(), a.begin() + s + 2); };
  conv_entry e;
  e.src = dnnl::memory::desc(src_d, dt, strides_of(p.src_strides));
  e.weights = dnnl::memory::desc(wei_d, dt, strides_of(p.weights_strides));
  e.dst = dnnl::memory::desc(dst_d, dt, strides_of(p.dst_strides));
  const dnnl::memory::desc any_weights(wei_d, dt, dnnl::memory::format_tag::any);
  auto& eng = ctx().engine;
  const auto algo = dnnl::algorithm::convolution_direct;
  const dnnl::convolution_forward::primitive_desc fwd(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, e.src, any_weights, e.dst, strides, dilates,
                                      pad_l, pad_r),
      eng);
  if (pass == 0) {
    e.weights_internal = fwd.weights_desc();
    e.prim = dnnl::convolution_forward(fwd);
    e.implementation = fwd.impl_info_str();
  } else if (pass == 1) {
    const dnnl::convolution_backward_data::primitive_desc bwd(
        dnnl::convolution_backward_data::desc(algo, e.src, any_weights, e.dst, strides, dilates, pad_l, pad_r), eng, fwd);
    e.weights_internal = bwd.weights_desc();
    e.prim = dnnl::convolution_backward_data(bwd);
    e.implementation = bwd.impl_info_str();
  } else {
    const dnnl::convolution_backward_weights::primitive_desc bwd(
        dnnl::convolution_backward_weights::desc(algo, e.src, any_weights, e.dst, strides, dilates, pad_l, pad_r), eng, fwd);
    e.weights_internal = bwd.diff_weights_desc();
    e.prim = dnnl::convolution_backward_weights(bwd);
    e.implementation = bwd.impl_info_str();
  }
  if (e.weights_internal != e.weights) {
    e.weights_buffer.resize(e.weights_internal.get_size());
    if (pass == 2)
      e.weights_out = dnnl::reorder(dnnl::reorder::primitive_desc(eng, e.weights_internal, eng, e.weights));
    else
      e.weights_in = dnnl::reorder(dnnl::reorder::primitive_desc(eng, e.weights, eng, e.weights_internal));
  }
  return e;
}

inline key_type conv_key(const conv_problem& p, int pass, int dt) {
  key_type k{pass, dt, p.spatial, p.n, p.ic, p.oc};
  for (int j = 0; j < p.spatial; ++j)
    k.insert(k.end(), {p.in[j], p.out[j], p.taps[j], p.stride[j], p.dilation[j], p.pad_lo[j], p.pad_hi[j]});
  for (int j = 0; j < p.spatial + 2; ++j) k.insert(k.end(), {p.src_strides[j], p.weights_strides[j], p.dst_strides[j]});
  return k;
}

inline const char* pass_name(int pass) {
  return pass == 0 ? "forward" : pass == 1 ? "backward data" : "backward weights";
}
template <class T>
std::string conv_words(const conv_problem& p, int pass) {
  std::string in, taps, out;
  for (int j = 0; j < p.spatial; ++j) {
    in += meshtensor::detail::cat(j ? " x " : "", p.in[j]);
    taps += meshtensor::detail::cat(j ? " x " : "", p.taps[j]);
    out += meshtensor::detail::cat(j ? " x " : "", p.out[j]);
  }
  return meshtensor::detail::cat("conv's local ", pass_name(pass), " pass (", type_name<T>(), ", batch ", p.n, ", ", p.ic,
                                 " channels in, ", p.oc, " out, spatial ", in, ", taps ", taps, ", output ", out, ")");
}

// Which path a convolution takes (direct or unfold + product) changes its communication, so it is
// decided from the agreed rule alone (kernels::has_convolution), never per shape: a shape oneDNN
// then refuses is an error that says so.
template <class T>
conv_entry& conv_for(const conv_problem& p, int pass) {
  try {
    return conv_cache().get(conv_key(p, pass, static_cast<int>(data_type_of<T>())), [&] { return make_conv<T>(p, pass); });
  } catch (const dnnl::error& e) {
    throw error(meshtensor::detail::cat("meshtensor: oneDNN made no primitive for ", conv_words<T>(p, pass), ": ", e.what(),
                                        " ", advice()));
  }
}

template <class T>
void run_conv(conv_entry& e, int pass_index, const T* src, const T* weights, const T* dst, std::int64_t src_offset) {
  auto& eng = ctx().engine;
  auto mem = [&](const dnnl::memory::desc& d, const T* at) { return dnnl::memory(d, eng, const_cast<T*>(at)); };
  dnnl::memory src_m = mem(e.src, src + src_offset), dst_m = mem(e.dst, dst), user_w = mem(e.weights, weights);
  dnnl::memory w = e.weights_buffer.empty() ? user_w : dnnl::memory(e.weights_internal, eng, e.weights_buffer.data());
  if (e.weights_in) e.weights_in->execute(ctx().stream, user_w, w);
  if (pass_index == 0)
    e.prim.execute(ctx().stream, {{DNNL_ARG_SRC, src_m}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, dst_m}});
  else if (pass_index == 1)
    e.prim.execute(ctx().stream, {{DNNL_ARG_DIFF_SRC, src_m}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DIFF_DST, dst_m}});
  else
    e.prim.execute(ctx().stream, {{DNNL_ARG_SRC, src_m}, {DNNL_ARG_DIFF_WEIGHTS, w}, {DNNL_ARG_DIFF_DST, dst_m}});
  if (e.weights_out) e.weights_out->execute(ctx().stream, w, user_w);
  ctx().stream.wait();
}

// src, weights and dst are the pass's: for backward data src is diff_src, for backward weights
// weights is diff_weights, for both backward passes dst is diff_dst.
template <class T>
void convolution(const conv_problem& p, conv_pass pass, const T* src, const T* weights, const T* dst) {
  const int pass_index = static_cast<int>(pass);
  if (p.empty()) {  // only backward weights reaches here empty: no product, a zero gradient
    std::int64_t n = p.oc * p.ic * p.taps_total();
    for (std::int64_t i = 0; i < n; ++i) const_cast<T*>(weights)[i] = T(0);
    return;
  }
  conv_entry& e = conv_for<T>(p, pass_index);
  try {
    run_conv(e, pass_index, src, weights, dst, p.src_offset);
  } catch (const dnnl::error& err) {
    throw error(meshtensor::detail::cat("meshtensor: oneDNN failed running ", conv_words<T>(p, pass_index), ": ", err.what(),
                                        " ", advice()));
  }
}

// The implementations oneDNN picked for the convolutions made so far (distinct names), for the
// benchmarks' reports.
inline std::vector<std::string> convolution_implementations() {
  std::vector<std::string> names;
  conv_cache().for_each([&](const conv_entry& e) {
    for (const auto& n : names)
      if (n == e.implementation) return;
    names.push_back(e.implementation);
  });
  return names;
}

}  // namespace meshtensor::kernels::dnnl_provider
#endif
