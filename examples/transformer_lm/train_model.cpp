// train<layout_model>, in a file of its own: see model.hpp.
#include "model.hpp"

template std::vector<double> train<layout_model>(const grid&, const options&, const std::vector<unsigned char>&, bool,
                                                std::int64_t*);
