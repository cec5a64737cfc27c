// train<layout_data>, in a file of its own: see training.hpp.
#include "training.hpp"

template train_result train<layout_data>(const grid&, const options&, const std::vector<unsigned char>&, bool);

template MESHTENSOR_LM_SP_LOSS(layout_data);  // refuses: nothing to compile
