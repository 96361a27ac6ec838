// The Unigram model as Hugging Face tokenizers runs it (what transformers 5 uses for T5, whether
// the folder holds tokenizer.json or only spiece.model): Viterbi over all vocabulary pieces,
// unknown characters scored min_score - 10 and consecutive unknowns fused into one unk.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tessera::tokenizers {

class UnigramModel {
 public:
  // vocab: (piece, score) in id order. unk_id: -1 when the model has none.
  UnigramModel(const std::vector<std::pair<std::string, double>>& vocab, int64_t unk_id);
  // Appends the ids of one pre-token (UTF-8).
  void encode(std::string_view text, std::vector<int64_t>& out) const;
  int64_t token_id(const std::string& piece) const;  // -1 when absent
  size_t vocab_size() const { return scores_.size(); }

 private:
  std::unordered_map<std::string, int64_t> ids_;
  std::vector<double> scores_;
  size_t max_piece_bytes_ = 0;
  double min_score_ = 0;
  int64_t unk_id_;
};

}  // namespace tessera::tokenizers
