// train<layout_model_parallel> and run<layout_model_parallel> (model.hpp), in a TU of their own so that the layouts compile in parallel.
#include "model.hpp"

namespace translation {
template train_result train<layout_model_parallel>(model<layout_model_parallel>&, const grid&, const options&, const dataset&, bool);
template train_result run<layout_model_parallel>(const grid&, const options&, const dataset&, const tokenizer*, bool);
}  // namespace translation
