// --pipeline's stages under layout_2d (pipeline.hpp), and the dispatch to the context layouts'
// (pipeline_context.cpp) and to sequence parallelism's (pipeline_sp.cpp): files of their own, one
// instantiation each (grouped into one TU by MESHTENSOR_LAYOUT_UNITY, tools/lm/CMakeLists.txt).
#include "pipeline.hpp"

pipeline_result train_pipelined(const mt::pipeline::stages<grid>& st, const options& o,
                                const std::vector<unsigned char>& text) {
  if (o.layout == "context" || o.layout == "2d_context") return train_pipelined_context(st, o, text);
  if (o.sequence_parallel) return train_pipelined_sequence_parallel(st, o, text);
  return lm_pipeline::train_pipelined_in<layout_2d>(st, o, text);
}
