// train<layout_data> and run<layout_data> (model.hpp), in a file of their own (MESHTENSOR_LAYOUT_UNITY compiles the three as one TU).
#include "model.hpp"

namespace translation {
template train_result train<layout_data>(model<layout_data>&, const grid&, const options&, const dataset&, bool);
template train_result run<layout_data>(const grid&, const options&, const dataset&, const tokenizer*, bool);
}  // namespace translation
