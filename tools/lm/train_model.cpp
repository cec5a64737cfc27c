// train<layout_model>, in a file of its own: see training.hpp.
#include "training.hpp"

template train_result train<layout_model>(const grid&, const options&, const std::vector<unsigned char>&, bool);
