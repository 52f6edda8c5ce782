// Explanations from the tower's interest weights (retrieval.serving.explain.top_events).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "retrieval.pb.h"

namespace mitt::native {

// ExplanationKind's number in the API of the kind named `explanation` ("attention", ...).
retrieval::v1::ExplanationKind ExplanationKindOf(const std::string& explanation);

// Per interest, the `top` events with the largest non-zero weights, largest first (ties: the
// older event first), into `out`'s interests.
//
// weights: float32 [interests, width], per interest the weights of the last `width` known
// events, right-aligned; history: the request's ids; positions: the place in `history` of each
// known event, oldest first.
void TopEvents(const float* weights, size_t interests, size_t width, const std::vector<std::string>& history,
               const std::vector<uint32_t>& positions, size_t top, retrieval::v1::Explanations* out);

}  // namespace mitt::native
