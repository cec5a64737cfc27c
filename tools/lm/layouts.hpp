#pragma once
// meshtensor-lm's names: the model's dims, the mesh's axes, and the layouts --layout chooses, with
// the layouts derived from them (decoding's, sequence parallelism's, the fsdp parameters').
#include <meshtensor/meshtensor.hpp>

namespace mt = meshtensor;
namespace nn = meshtensor::nn;

struct batch : mt::dim<"batch"> {};
struct length : mt::dim<"length"> {};
struct memory_length : mt::dim<"memory_length"> {};
struct d_model : mt::dim<"d_model"> {};
struct heads : mt::dim<"heads"> {};
struct d_kv : mt::dim<"d_kv"> {};
struct d_ff : mt::dim<"d_ff"> {};
struct vocab : mt::dim<"vocab"> {};
struct rows : mt::axis<"rows"> {};
struct cols : mt::axis<"cols"> {};
using grid = mt::mesh<rows, cols>;

using layout_data = mt::layout<grid, mt::split<batch, rows, cols>>;
using layout_model = mt::layout<grid, mt::split<vocab, rows, cols>, mt::split<heads, rows, cols>,
                                mt::split<d_ff, rows, cols>>;
using layout_2d = mt::layout<grid, mt::split<batch, rows>, mt::split<vocab, cols>, mt::split<heads, cols>,
                             mt::split<d_ff, cols>>;
// --layout context: the batch over rows and the sequence over cols (context parallelism; with
// --mesh 1 N the sequence alone). Attention (transformer_block) either moves the sequence's split to
// the heads and back (--attention all-to-all, nn::all_to_all_causal_attention: four alltoalls each
// way) or passes the keys' and values' blocks around the ring of cols (--attention ring,
// nn::ring_causal_attention: P - 1 shifts forward, P back); everything else is per position.
using layout_context = mt::layout<grid, mt::split<batch, rows>, mt::split<length, cols>>;
// --layout 2d_context: the sequence over rows (the context axis), vocab, heads and d_ff over cols
// (the tensor axis), the batch whole: context x tensor parallelism (Megatron-Core's cp x tp). The
// ring keeps the heads split over cols and passes blocks along rows; all-to-all moves the
// sequence's split onto the heads (heads over cols, then rows), so rows x cols is capped by them
// (parts beyond the heads idle).
using layout_2d_context = mt::layout<grid, mt::split<length, rows>, mt::split<vocab, cols>, mt::split<heads, cols>,
                                     mt::split<d_ff, cols>>;

// Decoding (--generate) computes under decode_layout_t<L>. One token has no sequence to split, so
// under --layout context (2d_context) the key-value cache's positions (memory_length) are split over
// the context axis, cols (rows), instead: a long prompt's keys and values take 1/P of the memory on
// each of P processors; a token's key and value are written by the processor holding its position,
// and attention's softmax and weighted sum over the cache end in allreduces over that axis. Other
// layouts decode under their own.
template <class L>
struct decode_layout {
  using type = L;
};
template <>
struct decode_layout<layout_context> {
  using type = mt::layout<grid, mt::split<batch, rows>, mt::split<memory_length, cols>>;
};
// --layout 2d_context: the cache's positions over rows (its context axis), a token's heads, d_ff and
// vocab over cols, as in training.
template <>
struct decode_layout<layout_2d_context> {
  using type = mt::layout<grid, mt::split<memory_length, rows>, mt::split<vocab, cols>, mt::split<heads, cols>,
                          mt::split<d_ff, cols>>;
};
template <class L>
using decode_layout_t = typename decode_layout<L>::type;

// --sequence-parallel: between the blocks' products, the residual stream [batch, length, d_model]
// has length split over the axes that split heads and d_ff, so the products' pending sums arrive
// by reduce_scatter (each processor receives the sum of its part of the sequence: half an
// allreduce's traffic), the layer norms, residual adds and dropout run on 1/P of the tokens, and an
// allgather brings each block's normalised input back whole for the next products (Megatron-LM's
// sequence parallelism, written with ops/partial_sum.hpp); the products keep only its 1/P part for
// the backward pass, which gathers it again (ops/relayout_regathered.hpp). Layouts that split heads
// only.
template <class L>
struct sequence_layout {};
template <>
struct sequence_layout<layout_model> {
  using type = mt::layout<grid, mt::split<vocab, rows, cols>, mt::split<heads, rows, cols>, mt::split<d_ff, rows, cols>,
                          mt::split<length, rows, cols>>;
};
template <>
struct sequence_layout<layout_2d> {
  using type = mt::layout<grid, mt::split<batch, rows>, mt::split<vocab, cols>, mt::split<heads, cols>,
                          mt::split<d_ff, cols>, mt::split<length, cols>>;
};

// --layout fsdp and fsdp_2d: fully sharded data parallelism (ops/gather_for_use.hpp). The model
// computes under layout_data (fsdp) or layout_2d (fsdp_2d); its parameters are stored with d_model
// (a dim every one of them has) split over the axes that split the batch, on top of the model
// splits of layout_2d. --zero says what is split (optim/sharded.hpp): 3 (the default) stores the
// parameters split and gathers each where a block uses it; 2 stores them split and gathers them all
// once per step; 1 stores them whole and splits only the optimizer's state. In each case the
// gradients, the optimizer's state and (2, 3) the parameters are split as the same layout says.
using params_fsdp = mt::layout<grid, mt::split<d_model, rows, cols>>;
using params_fsdp_2d = mt::layout<grid, mt::split<d_model, rows>, mt::split<vocab, cols>, mt::split<heads, cols>,
                                  mt::split<d_ff, cols>>;
template <class L>
struct shard_layout_of {};
template <>
struct shard_layout_of<layout_data> {
  using type = params_fsdp;
};
template <>
struct shard_layout_of<layout_2d> {
  using type = params_fsdp_2d;
};
