// bf16_loss<layout_2d>, in a file of its own: see training.hpp.
#include "training.hpp"

template MESHTENSOR_LM_BF16_LOSS(layout_2d);
