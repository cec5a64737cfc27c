// train<layout_data> (model.hpp), in a TU of its own so that the layouts compile in parallel.
#include "model.hpp"

template translation::train_result translation::train<translation::layout_data>(const grid&, const options&, const dataset&,
                                                                             const tokenizer*, bool);
