// train<layout_dp_mp> and run<layout_dp_mp> (model.hpp), in a file of their own (MESHTENSOR_LAYOUT_UNITY compiles the three as one TU).
#include "model.hpp"

namespace translation {
template train_result train<layout_dp_mp>(model<layout_dp_mp>&, const grid&, const options&, const dataset&, bool);
template train_result run<layout_dp_mp>(const grid&, const options&, const dataset&, const tokenizer*, bool);
}  // namespace translation
