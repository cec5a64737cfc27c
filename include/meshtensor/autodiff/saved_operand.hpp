#pragma once
// What a product's gradient rule keeps of an operand: the operand itself, or, where its slice has a
// source (tensor/tensor.hpp's slice_source: relayout_regathered's gathered input), only its place on
// the tape and the source, the slice made again when the rule runs. So the backward pass of
// sequence parallelism keeps each block's 1/t input, not the gathered one (Korthikanti et al.
// 2022), and gathers it once more, for all the products that read it.
#include <memory>

#include "tape.hpp"

namespace meshtensor::detail {

// x as a rule captures it: whole, or without its data where a source can make it again (one more
// user of the source).
template <Tensor TT>
TT kept_for_backward(const TT& x) {
  if (!x.storage().source) return x;
  ++x.storage().source->users;
  return node_only(x);
}

// The operand that kept_for_backward kept, with its data: made by the source, once for all its
// users; the made slice is dropped by the source when its last user has it.
template <Tensor TT>
TT made_again(const TT& kept) {
  const auto& source = kept.storage().source;
  if (!source) return kept;
  if (!source->made) source->made = std::make_shared<typename TT::storage_type>(source->make());
  auto st = kept.storage();
  st.data = source->made->data;
  st.planned_bytes = source->made->planned_bytes;
  st.source.reset();
  if (--source->users <= 0) source->made.reset();
  return TT(from_storage, kept.mesh().shared_communicator(), st);
}

}  // namespace meshtensor::detail
