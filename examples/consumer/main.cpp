// Routes two tokens over four experts with moekit's topk_softmax and prints the picks.
#include <cstdio>

#include "moekit/ops/routing.h"

int main() {
  float logits[2][4] = {{0.1f, 2.0f, -1.0f, 1.5f}, {3.0f, 0.0f, 0.0f, 0.5f}};
  float weights[2][2];
  int ids[2][2];
  moekit::TopkSoftmaxParams p;
  p.gating = moekit::TensorView::contiguous(logits, moekit::DType::f32, {2, 4});
  p.k = 2;
  p.renormalize = true;
  p.topk_weights = moekit::TensorView::contiguous(weights, moekit::DType::f32, {2, 2});
  p.topk_ids = moekit::TensorView::contiguous(ids, moekit::DType::i32, {2, 2});
  const moekit::Status s = moekit::topk_softmax(p);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.to_string().c_str());
    return 1;
  }
  for (int t = 0; t < 2; ++t) std::printf("token %d: experts %d %d weights %.4f %.4f\n", t, ids[t][0], ids[t][1], weights[t][0], weights[t][1]);
  return (ids[0][0] == 1 && ids[0][1] == 3 && ids[1][0] == 0 && ids[1][1] == 3) ? 0 : 1;
}
