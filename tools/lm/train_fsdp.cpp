// train<layout_data, params_fsdp> (--layout fsdp), in a file of its own: see training.hpp.
#include "training.hpp"

template train_result train<layout_data, params_fsdp>(const grid&, const options&, const std::vector<unsigned char>&, bool);
