// train<layout_model_parallel> and run<layout_model_parallel> (model.hpp), in a file of their own (MESHTENSOR_LAYOUT_UNITY compiles the three as one TU).
#include "model.hpp"

namespace translation {
template train_result train<layout_model_parallel>(model<layout_model_parallel>&, const grid&, const options&, const dataset&, bool);
template train_result run<layout_model_parallel>(const grid&, const options&, const dataset&, const tokenizer*, bool);
}  // namespace translation
