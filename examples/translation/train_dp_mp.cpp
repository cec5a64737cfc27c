// train<layout_dp_mp> (model.hpp), in a TU of its own so that the layouts compile in parallel.
#include "model.hpp"

template translation::train_result translation::train<translation::layout_dp_mp>(const grid&, const options&, const dataset&,
                                                                             const tokenizer*, bool);
