// --pipeline's stages under layout_2d with --sequence-parallel (pipeline.hpp), in a file of its own
// (see pipeline.cpp).
#include "pipeline.hpp"

pipeline_result train_pipelined_sequence_parallel(const mt::pipeline::stages<grid>& st, const options& o,
                                                  const std::vector<unsigned char>& text) {
  return lm_pipeline::train_pipelined_sequence_parallel_in<layout_2d>(st, o, text);
}
