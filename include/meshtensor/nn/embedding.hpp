#pragma once
// embedding<Vocab>(table, ids): table[Vocab, d...] looked up at ids[...] -> out[ids' dims..., d...].
// Communication and gradient: ops/gather.hpp's (the vocab dim may be split, over axes that do not
// split the ids).
#include "../ops/gather.hpp"

namespace meshtensor::nn {

template <Dim Vocab, Tensor Table, Tensor Ids>
auto embedding(const Table& table, const Ids& ids) {
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"embedding"});
  return gather<Vocab>(table, ids);
}

}  // namespace meshtensor::nn
