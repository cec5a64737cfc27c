// train<layout_2d>, in a file of its own: see training.hpp.
#include "training.hpp"

template train_result train<layout_2d>(const grid&, const options&, const std::vector<unsigned char>&, bool);
