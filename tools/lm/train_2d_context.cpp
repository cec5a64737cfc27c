// train<layout_2d_context>, in a file of its own: see training.hpp.
#include "training.hpp"

template train_result train<layout_2d_context>(const grid&, const options&, const std::vector<unsigned char>&, bool);

template MESHTENSOR_LM_SP_LOSS(layout_2d_context);  // refuses: nothing to compile
