// --pipeline's stages under --layout context or 2d_context (pipeline.hpp): context parallelism
// inside each stage, in a file of its own (see pipeline.cpp).
#include "pipeline.hpp"

pipeline_result train_pipelined_context(const mt::pipeline::stages<grid>& st, const options& o,
                                        const std::vector<unsigned char>& text) {
  if (o.layout == "context") return lm_pipeline::train_pipelined_in<layout_context>(st, o, text);
  return lm_pipeline::train_pipelined_in<layout_2d_context>(st, o, text);
}
