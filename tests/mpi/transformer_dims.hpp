#pragma once
// The Transformer's dims, as the nn tests name them (one declaration for every test that builds
// attention, feed-forward and embedding layers).
#include <meshtensor/meshtensor.hpp>

namespace tst {
struct batch : meshtensor::dim<"batch"> {};
struct length : meshtensor::dim<"length"> {};
struct mlen : meshtensor::dim<"memory_length"> {};
struct d_model : meshtensor::dim<"d_model"> {};
struct heads : meshtensor::dim<"heads"> {};
struct kv_heads : meshtensor::dim<"kv_heads"> {};  // grouped-query attention's key and value heads
struct group : meshtensor::dim<"group"> {};        // and the query heads of each
struct d_kv : meshtensor::dim<"d_kv"> {};
struct d_ff : meshtensor::dim<"d_ff"> {};
struct vocab : meshtensor::dim<"vocab"> {};
}  // namespace tst
