// train<layout_data> and run<layout_data> (model.hpp), in a TU of their own so that the layouts compile in parallel.
#include "model.hpp"

namespace translation {
template train_result train<layout_data>(model<layout_data>&, const grid&, const options&, const dataset&, bool);
template train_result run<layout_data>(const grid&, const options&, const dataset&, const tokenizer*, bool);
}  // namespace translation
